"""Search QA: several turns of `search[query]`, then `finish[answer]`, scored by F1 or exact match.

Each turn's answer block holds one action: `search[query]` shows the top-k passages for the query (title and
text, cut to `observation_tokens` tokens of the policy's tokenizer in all, or without a tokenizer to
`observation_words` whitespace-separated words), `finish[answer]` ends the episode with
reward SQuAD-F1 (or exact match, `reward="em"`) of the answer against the best gold answer, after SQuAD's
normalisation (lower case, no punctuation, no articles, single spaces); success is an exact match. Anything
else in the block (another action, two actions, an empty query or answer, text around the action) is a format
failure:
reward 0, the last observation again, and the rollout applies the format penalty. A search on the last of `max_turns`
turns ends the episode with reward 0 (the reference's 5 turns, RAGEN `config/_10_search.yaml`).

Questions come from a JSON/JSONL file (`questions=`): `{"question": str, "answers": [str, ...] | str,
"supporting_titles"?: [str, ...]}` per record; validation from `validation_questions`, or a stable
hash-chosen `validation_fraction` of the file. Passages come from a retrieval server (`server_url=`, see
`envs.host.retrieval.HttpRetriever`) or a BM25 index over a JSONL corpus (`corpus=`). Without `questions`, a
generated two-hop set and its corpus (`envs.host.search_data`, `generated_seed`, `generated_people`) are written
into `data_dir` (default: `search/` in the host's cache) and used with BM25. A search the server fails to
answer shows the error as the observation (the turn is used, reward 0); a server that does not answer when the
env is configured is an error then.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import string

from envs.host.base import TextStep, check_split, extract_answer, format_failure, split_index
from envs.host.records import existing_file, field, file_digest, hash_split, read_records
from envs.host.retrieval import Bm25Retriever, HttpRetriever, Passage, RetrievalError
from envs.host.search_data import write_generated
from ragen_jax import paths

INSTRUCTION = (
  "You are answering questions by searching a collection of passages. Each turn, give exactly one action: "
  "search[query] shows the passages that best match the query, finish[answer] submits your final short answer. "
  "Questions may need several searches. Example answer format: <think> I need to know who directed the film "
  "first. </think><answer>search[director of the film]</answer>"
)
ACTIONS = "Available actions: search[<query>], finish[<answer>]"
_ACTION_START = re.compile(r"(search|finish)\[", re.IGNORECASE)
_PUNCTUATION = frozenset(string.punctuation)


@dataclasses.dataclass(frozen=True)
class SearchOptions:
  """The search env's settings (`env.params`); "" means unset."""

  questions: str = ""  # JSON/JSONL questions; "" = the generated set
  validation_questions: str = ""
  validation_fraction: float = 0.1
  corpus: str = ""  # JSONL corpus for BM25 ("" with the generated set: its corpus)
  server_url: str = ""  # a Search-R1 style retrieval server instead of BM25
  top_k: int = 3
  observation_words: int = 300  # budget of one search observation, in whitespace-separated words ...
  tokenizer: str = ""  # ... or, given a tokenizer (a directory with tokenizer.json, or the file), in its tokens:
  observation_tokens: int = 400
  reward: str = "f1"  # "f1" or "em"
  max_turns: int = 5
  request_timeout: float = 10.0  # seconds per server request
  request_retries: int = 2
  generated_seed: int = 0
  generated_people: int = 200
  data_dir: str = ""  # where the generated set is written ("" = `search/` in the host's cache)


def parse_action(text: str) -> tuple[str, str] | None:
  """("search" | "finish", argument) of an answer block holding exactly one action with a non-empty argument
  (whitespace collapsed); None for anything else."""
  text = text.strip()
  start = _ACTION_START.match(text)
  if not start or not text.endswith("]"):
    return None
  argument = text[start.end() : -1]
  if not argument.strip() or _ACTION_START.search(argument):
    return None
  return start.group(1).lower(), " ".join(argument.split())


def normalize_answer(text: str) -> str:
  """SQuAD's normalisation: lower case, punctuation and the articles a/an/the removed, whitespace collapsed."""
  text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
  return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
  """SQuAD token F1 of the normalised strings."""
  predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
  common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
  if not predicted or not expected:
    return float(predicted == expected)
  if common == 0:
    return 0.0
  precision, recall = common / len(predicted), common / len(expected)
  return 2 * precision * recall / (precision + recall)


def cut_words(text: str, budget: int) -> str:
  """`text` cut to its first `budget` whitespace-separated words ("..." marks a cut)."""
  words = text.split()
  return " ".join(words[:budget]) + (" ..." if len(words) > budget else "")


@functools.cache
def token_cutter(tokenizer: str):
  """A `cut(text, budget)` keeping the first `budget` tokens of the tokenizer at `tokenizer` (a directory with
  tokenizer.json, or the file; local or `gs://`): the text up to the end of the last kept token. Cached."""
  from tokenizers import Tokenizer

  path = tokenizer if tokenizer.endswith(".json") else paths.join(tokenizer, "tokenizer.json")
  if not paths.exists(path):
    raise FileNotFoundError(f"search env tokenizer not found: {path}")
  encoder = Tokenizer.from_str(paths.read_text(path))

  def cut(text: str, budget: int) -> str:
    offsets = encoder.encode(text, add_special_tokens=False).offsets
    return text if len(offsets) <= budget else text[: offsets[budget - 1][1]] + " ..."

  return cut


def render_passages(query: str, passages: list[Passage], budget: int, cut=cut_words) -> str:
  """The observation of a search: numbered passages, each cut (`cut(text, share)`) to an equal share of `budget`
  (words, or tokens with a `token_cutter`)."""
  if not passages:
    return f"No passages found for {query!r}.\n{ACTIONS}"
  share = max(1, budget // len(passages))
  blocks = [f"[{rank}] " + cut(f"{passage.title}: {passage.text}", share) for rank, passage in enumerate(passages, 1)]
  return f"Results for {query!r}:\n" + "\n".join(blocks) + f"\n{ACTIONS}"


def _check_question(record: dict, place: str) -> dict:
  question = field(record, ("question",), place)
  answers = field(record, ("answers", "answer", "golden_answers"), place)
  answers = [answers] if isinstance(answers, str) else answers
  if not isinstance(question, str) or not question.strip():
    raise ValueError(f"{place}: the question must be a non-empty string")
  if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
    raise ValueError(f"{place}: answers must be a non-empty string or list of non-empty strings")
  return {"question": question.strip(), "answers": tuple(answers),
          "supporting_titles": tuple(record.get("supporting_titles") or ())}


@functools.cache
def _load_questions(path: str, digest: str) -> tuple[dict, ...]:
  del digest  # the cache key only: a changed file is read again
  items = tuple(_check_question(record, place) for place, record in read_records(path))
  if not items:
    raise ValueError(f"{path} has no questions")
  return items


def load_questions(path: str) -> tuple[dict, ...]:
  """The checked question records of a JSON/JSONL file (cached per process and file version)."""
  path = existing_file(path, "search question file")
  return _load_questions(path, file_digest(path))


@functools.cache
def _split(questions: str, validation_questions: str, fraction: float, digest: str) -> dict[str, tuple[dict, ...]]:
  del digest  # the cache key only
  if validation_questions:
    return {"train": load_questions(questions), "validation": load_questions(validation_questions)}
  return hash_split(load_questions(questions), lambda q: q["question"], fraction, questions, "validation_questions")


@functools.cache
def _server(url: str, timeout: float, retries: int) -> HttpRetriever:
  """The client of `url`, checked once per process with one search (a clear error when the server is down)."""
  retriever = HttpRetriever(url, timeout, retries)
  try:
    retriever.search("test", 1)
  except RetrievalError as error:
    raise ValueError(f"search env: {error}") from error
  return retriever


class SearchEnv:
  """One search QA episode; `reset(seed)` picks question seed mod split size."""

  name = "search"
  instruction = INSTRUCTION
  OPTIONS = SearchOptions

  def __init__(self, **options):
    """`options`: `SearchOptions` fields (unknown ones raise TypeError); the data is read and checked here."""
    self.options = o = SearchOptions(**options)
    if o.reward not in ("f1", "em"):
      raise ValueError(f"reward must be 'f1' or 'em', got {o.reward!r}")
    if (min(o.max_turns, o.top_k, o.observation_words, o.observation_tokens) < 1
        or not 0.0 <= o.validation_fraction < 1.0):
      raise ValueError("search env needs max_turns, top_k, observation_words, observation_tokens >= 1 and "
                       "validation_fraction in [0, 1)")
    questions, corpus = o.questions, o.corpus
    if not questions:
      if corpus or o.validation_questions or o.server_url:
        raise ValueError("corpus, validation_questions and server_url need a questions file; without one the env "
                         "uses its generated set")
      corpus, questions = write_generated(o.data_dir or paths.join(paths.default_cache_root(), "search"),
                                          o.generated_seed, o.generated_people)
    if bool(corpus) == bool(o.server_url):
      raise ValueError("search env needs exactly one of corpus (a JSONL file for BM25) and server_url")
    digest = file_digest(questions, o.validation_questions)
    self._splits = _split(paths.join(questions), o.validation_questions and paths.join(o.validation_questions),
                          o.validation_fraction, digest)
    self.retriever = (_server(o.server_url, o.request_timeout, o.request_retries) if o.server_url
                      else Bm25Retriever.for_corpus(corpus))
    self._cut, self._budget = ((token_cutter(o.tokenizer), o.observation_tokens) if o.tokenizer
                               else (cut_words, o.observation_words))
    self.max_turns = o.max_turns
    self._question: dict | None = None
    self._observation, self._turn, self._done = "", 0, False

  def questions(self, split: str = "train") -> tuple[dict, ...]:
    return self._splits[check_split(split)]

  def reset(self, seed: int, split: str = "train") -> str:
    table = self.questions(split)
    self._question, self._turn, self._done = table[split_index(seed, len(table))], 0, False
    self._observation = f"Question: {self._question['question']}\n{ACTIONS}"
    return self._observation

  def step(self, response: str, enable_think: bool = True) -> TextStep:
    if self._question is None or self._done:
      raise RuntimeError("no episode running: call reset() first")
    answers = self._question["answers"]
    answer = extract_answer(response, enable_think)
    action = parse_action(answer) if answer is not None else None
    if action is None:
      return format_failure(self._observation, {"target": answers})
    kind, argument = action
    self._turn += 1
    info = {"answer": answer, "action": kind, "target": answers}
    if kind == "finish":
      score = f1_score if self.options.reward == "f1" else exact_match
      reward = max(score(argument, gold) for gold in answers)
      self._done = True
      return TextStep("", reward, True, max(exact_match(argument, gold) for gold in answers) == 1.0, True, info)
    if self._turn >= self.max_turns:
      self._done = True
      return TextStep("", 0.0, True, False, True, info)
    try:
      observation = render_passages(argument, self.retriever.search(argument, self.options.top_k), self._budget,
                                    self._cut)
    except RetrievalError as error:
      observation, info = f"Search failed: {error}\n{ACTIONS}", {**info, "search_error": str(error)}
    self._observation = observation
    return TextStep(observation, 0.0, False, False, True, info)
