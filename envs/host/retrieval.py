"""Passage retrievers for the search environment: a local BM25 index and a retrieval-server client.

Both answer `search(query, k) -> [Passage, ...]`, best first.

* `Bm25Retriever`: bm25s over a JSONL corpus (`load_corpus`); the index is saved beside the corpus in
  `<corpus>.bm25s-<digest>` (the digest follows the file's path, size and modification time) and reloaded
  from there, so a changed corpus gets a fresh index.
* `HttpRetriever`: a client of RAGEN's (Search-R1's) retrieval server, `POST <url>/retrieve` with
  `{"queries": [q], "topk": k, "return_scores": true}` answered by
  `{"result": [[{"document": {"contents": "\\"Title\\"\\ntext"}, "score": s}, ...]]}`. Every request has a
  timeout and is retried; a server that stays down, or a reply in another shape, raises `RetrievalError`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import urllib.error
import urllib.request

from envs.host.records import existing_file, file_digest, read_records
from ragen_jax import paths


_INDEX_COMPLETE = "complete"  # written into an index directory once the index is saved whole


class RetrievalError(RuntimeError):
  """The retriever could not answer (server down, timed out, or a reply in another format)."""


@dataclasses.dataclass(frozen=True)
class Passage:
  title: str
  text: str
  score: float = 0.0


def split_contents(contents: str) -> tuple[str, str]:
  """(title, text) of a Search-R1 corpus `contents` string: `"Title"` on the first line, the text after it."""
  first, _, rest = contents.partition("\n")
  return first.strip().strip('"'), rest.strip()


def load_corpus(path: str) -> tuple[Passage, ...]:
  """The passages of a JSONL corpus: `{"contents": "\\"Title\\"\\ntext"}` (Search-R1's wiki layout) or
  `{"title": ..., "text": ...}` per line; ValueError naming the line of a broken record."""
  passages = []
  for place, record in read_records(path):
    if isinstance(record.get("contents"), str):
      title, text = split_contents(record["contents"])
    elif isinstance(record.get("text"), str):
      title, text = str(record.get("title", "")).strip(), record["text"].strip()
    else:
      raise ValueError(f"{place}: a corpus record needs a string 'contents' or 'text'; has {sorted(record)}")
    if not (title or text):
      raise ValueError(f"{place}: the passage is empty")
    passages.append(Passage(title, text))
  if not passages:
    raise ValueError(f"{path} has no passages")
  return tuple(passages)


def _tokenize(texts: list[str]):
  import bm25s

  return bm25s.tokenize(texts, stopwords="en", show_progress=False)


class Bm25Retriever:
  """BM25 (bm25s) over the passages of a JSONL corpus; build with `Bm25Retriever.for_corpus` (cached)."""

  def __init__(self, passages: tuple[Passage, ...], index):
    self.passages, self._index = passages, index

  @classmethod
  def for_corpus(cls, corpus: str) -> Bm25Retriever:
    """The retriever of `corpus`, its index loaded from beside it or built and saved there (once per process)."""
    corpus = existing_file(corpus, "search corpus")
    return _bm25_retriever(corpus, file_digest(corpus))

  def search(self, query: str, k: int) -> list[Passage]:
    return [dataclasses.replace(self.passages[i], score=s) for i, s in bm25_top(self._index, query, k)]


def bm25_index(source: str, digest: str, texts: list[str]):
  """The bm25s index of `texts` (the documents of the file `source`), loaded from `<source>.bm25s-<digest>` or
  built and saved there."""
  import bm25s

  index_dir = f"{source}.bm25s-{digest}"
  complete = paths.join(index_dir, _INDEX_COMPLETE)
  if paths.exists(complete):
    return bm25s.BM25.load(paths.staged(index_dir), show_progress=False)
  index = bm25s.BM25()
  index.index(_tokenize(texts), show_progress=False)
  with paths.writing_dir(index_dir) as local:
    index.save(local, show_progress=False)
  paths.write_text(complete, f"{source}\n")  # last: a half-written index is never loaded
  return index


def bm25_top(index, query: str, k: int) -> list[tuple[int, float]]:
  """(document number, score) of the best `k` documents with a positive score, best first."""
  k = min(k, index.scores["num_docs"])
  if not query.strip() or k < 1:
    return []
  ids, scores = index.retrieve(_tokenize([query]), k=k, show_progress=False, n_threads=1)
  return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


@functools.cache
def _bm25_retriever(corpus: str, digest: str) -> Bm25Retriever:
  passages = load_corpus(corpus)
  return Bm25Retriever(passages, bm25_index(corpus, digest, [f"{p.title}\n{p.text}" for p in passages]))


class HttpRetriever:
  """A client of a Search-R1 style retrieval server (module docstring); never waits past `timeout` a try."""

  def __init__(self, url: str, timeout: float = 10.0, retries: int = 2, backoff: float = 0.5):
    if not url.startswith(("http://", "https://")):
      raise ValueError(f"retrieval server URL must start with http:// or https://, got {url!r}")
    if timeout <= 0 or retries < 0:
      raise ValueError(f"need timeout > 0 and retries >= 0, got {timeout} and {retries}")
    self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/retrieve") else "/retrieve")
    self.timeout, self.retries, self.backoff = timeout, retries, backoff

  def search(self, query: str, k: int) -> list[Passage]:
    body = json.dumps({"queries": [query], "topk": k, "return_scores": True}).encode()
    request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
    for attempt in range(self.retries + 1):
      try:
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
          return self._passages(json.loads(response.read()))
      except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        reason = f"HTTP {error.code} {error.reason}" if isinstance(error, urllib.error.HTTPError) else (
          getattr(error, "reason", error))
        if attempt == self.retries:
          raise RetrievalError(f"retrieval server {self.url} did not answer after {self.retries + 1} tries "
                               f"({reason})") from error
        time.sleep(self.backoff * 2**attempt)
      except ValueError as error:  # a reply that is not JSON
        raise RetrievalError(f"retrieval server {self.url} sent a reply that is not JSON ({error})") from error

  def _passages(self, reply) -> list[Passage]:
    try:
      hits = reply["result"][0]
      contents = [hit["document"] if isinstance(hit["document"], str) else hit["document"]["contents"] for hit in hits]
      return [Passage(*split_contents(c), float(hit.get("score", 0.0))) for c, hit in zip(contents, hits)]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
      raise RetrievalError(f"retrieval server {self.url} replied in another format than "
                           f"{{'result': [[{{'document': {{'contents': ...}}, 'score': ...}}]]}}: "
                           f"{str(reply)[:200]}") from error
