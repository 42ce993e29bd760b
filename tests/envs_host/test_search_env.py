"""Search QA: BM25 finds the generated questions' passages, F1/EM follow SQuAD, a solver reaches full reward
through the action interface, the HTTP client handles a stub server's answers, delays and errors, and bad input
is a format failure or a clear error."""

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings, strategies as st

import envs.host
from envs.host import retrieval, search
from envs.host.retrieval import HttpRetriever, RetrievalError
from envs.host.search_data import generate
from ragen_jax.assembly import check_model_and_env
from ragen_jax.config import ConfigError, load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ = settings(max_examples=200, deadline=None, database=None)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("search"))


def _env(data_dir, **options):
  return envs.host.make_text_env("search", data_dir=data_dir, **options)


def _act(action: str) -> str:
  return f"<think>ok</think><answer>{action}</answer>"


def test_generated_set_is_deterministic_and_two_hop():
  corpus, questions = generate(seed=3, people=50)
  assert (corpus, questions) == generate(seed=3, people=50) and generate(seed=4, people=50) != (corpus, questions)
  titles = {record["title"] for record in corpus}
  assert len(titles) == 50 and len(questions) == 50
  for question in questions:
    first, second = question["supporting_titles"]
    assert first in question["question"] and second not in question["question"] and first != second


def test_bm25_ranks_the_gold_passage_first(data_dir):
  env = _env(data_dir)
  questions = env.questions("train") + env.questions("validation")
  first_hop = [env.retriever.search(q["question"], 1)[0].title == q["supporting_titles"][0] for q in questions]
  second_hop = [env.retriever.search(q["supporting_titles"][1], 1)[0].title == q["supporting_titles"][1]
                for q in questions]
  print(f"rank-1 gold passage: question {sum(first_hop)}/{len(questions)}, bridge {sum(second_hop)}/{len(questions)}")
  assert sum(first_hop) >= 0.9 * len(questions) and all(second_hop)


def test_bm25_index_is_saved_beside_the_corpus_and_reloaded(data_dir):
  env = _env(data_dir)
  [index_dir] = [d for d in os.listdir(os.path.join(data_dir, "generated-seed0-people200")) if ".bm25s-" in d]
  corpus = os.path.join(data_dir, "generated-seed0-people200", "corpus.jsonl")
  assert index_dir.startswith("corpus.jsonl.bm25s-")
  reloaded = retrieval._bm25_retriever.__wrapped__(corpus, index_dir.rsplit("-", 1)[1])  # from disk, not rebuilt
  query = env.questions()[0]["question"]
  assert reloaded.search(query, 3) == env.retriever.search(query, 3)
  assert env.retriever.search("the of", 3) == env.retriever.search("!!", 3) == env.retriever.search("", 3) == []


@pytest.mark.parametrize("prediction, gold, em, f1", [
  ("The Eiffel Tower!", "eiffel tower", 1.0, 1.0),
  ("  an   apple ", "Apple.", 1.0, 1.0),
  ("Paris, France", "Paris", 0.0, 2 / 3),
  ("the red big house", "big red barn", 0.0, 2 / 3),  # "red big house" vs "big red barn": 2 of 3 each way
  ("red", "big red barn", 0.0, 0.5),
  ("London", "Paris", 0.0, 0.0),
  ("the", "a", 1.0, 1.0),  # both normalise to nothing
  ("", "Paris", 0.0, 0.0),
])
def test_squad_exact_match_and_f1(prediction, gold, em, f1):
  assert search.exact_match(prediction, gold) == em
  assert search.f1_score(prediction, gold) == pytest.approx(f1)


_NAME = re.compile(r"the mentor of (.+?) (?:born|work)")


def _solve(env, seed: int, split: str) -> search.TextStep:
  """Plays the generated question of `seed` with searches only: the person, then their mentor, then finish."""
  question = env.reset(seed, split)
  person = _NAME.search(question).group(1)
  found = env.step(_act(f"search[{person}]")).observation
  mentor = re.search(rf"The mentor of {re.escape(person)} is (.+?)\.", found).group(1)
  found = env.step(_act(f"search[{mentor}]")).observation
  relation = "was born in" if "born?" in question else "works for"
  answer = re.search(rf"{re.escape(mentor)} {relation} (.+?)\.", found).group(1)
  return env.step(_act(f"finish[{answer}]"))


def test_solver_reaches_full_reward_through_the_actions(data_dir):
  env = _env(data_dir)
  for split in ("train", "validation"):
    for seed in range(len(env.questions(split))):
      step = _solve(env, seed, split)
      assert (step.reward, step.success, step.done, step.format_ok) == (1.0, True, True, True)


def test_episode_rules(data_dir):
  env = _env(data_dir, max_turns=2)
  env.reset(0)
  gold = env.questions()[0]["answers"][0]
  for bad in ("no tags", _act("search[]"), _act("finish[  ]"), _act("lookup[x]"), _act("search[a] finish[b]"),
              _act("I think search[x]")):
    step = env.step(bad)
    assert (step.format_ok, step.reward, step.done) == (False, 0.0, False) and step.observation.startswith("Question:")
  nothing = env.step(_act("search[nothing matches zzzz]"))
  assert not nothing.done and nothing.observation.startswith("No passages found")
  assert env.step("no tags").observation == nothing.observation  # a format failure shows the last observation
  last = env.step(_act("search[again]"))  # the second valid turn of two: the episode ends unanswered
  assert (last.done, last.reward, last.success) == (True, 0.0, False)
  with pytest.raises(RuntimeError, match="reset"):
    env.step(_act(f"finish[{gold}]"))
  env.reset(0)
  partial = env.step(_act(f"FINISH[{gold} city]"))
  assert partial.done and 0.0 < partial.reward < 1.0 and not partial.success
  em = _env(data_dir, reward="em")
  em.reset(0)
  assert em.step(_act(f"finish[{gold} city]")).reward == 0.0


def test_observation_budget_in_words_or_the_policys_tokens(data_dir):
  from tokenizers import Tokenizer

  from ragen_jax.models.gguf_convert import bundled_tokenizer_dir

  query = _env(data_dir).questions()[0]["question"]
  words = _env(data_dir, observation_words=12)
  words.reset(0)
  blocks = words.step(_act(f"search[{query}]")).observation.splitlines()[1:-1]
  assert len(blocks) == 3 and all(len(b.split()) <= 1 + 4 + 1 for b in blocks)  # "[r]", 4 words, "..."
  tokenizer_dir = str(bundled_tokenizer_dir())
  tokens = _env(data_dir, tokenizer=tokenizer_dir, observation_tokens=30)
  tokens.reset(0)
  encoder = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
  passages = {f"{p.title}: {p.text}" for p in tokens.retriever.search(query, 3)}
  for block in tokens.step(_act(f"search[{query}]")).observation.splitlines()[1:-1]:
    kept = block.split("] ", 1)[1].removesuffix(" ...")
    assert len(encoder.encode(kept, add_special_tokens=False).ids) == 10  # its share of 30 tokens
    assert any(p.startswith(kept) and len(p) > len(kept) for p in passages)
  with pytest.raises(FileNotFoundError, match="tokenizer not found"):
    _env(data_dir, tokenizer=str(data_dir))


@FUZZ
@given(text=st.text(max_size=120) | st.builds(lambda k, a: f"{k}[{a}]", st.sampled_from(["search", "finish", "Finish"]),
                                              st.text(max_size=40)))
def test_action_parser_and_steps_never_crash(data_dir, text):
  action = search.parse_action(text)
  assert action is None or (action[0] in ("search", "finish") and action[1] and action[1] == action[1].strip())
  env = _env(data_dir)
  env.reset(len(text))
  step = env.step(_act(text))
  assert step.format_ok == (action is not None) and 0.0 <= step.reward <= 1.0


class _StubServer(BaseHTTPRequestHandler):
  """Search-R1's /retrieve: the query picks the behaviour ("slow", "error", "shape", "garbage")."""

  def do_POST(self):  # noqa: N802 (http.server's name)
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    query, k = body["queries"][0], body["topk"]
    if query == "slow":  # past the client's timeout: it has gone when this would answer
      time.sleep(1.0)
      return
    if query == "error":
      self.send_response(500)
      self.end_headers()
      return
    reply = {"result": [[{"document": {"id": str(i), "contents": f'"Doc {i}"\nabout {query}'}, "score": 1.0 / (i + 1)}
                         for i in range(k)]]}
    data = {"shape": b'{"results": []}', "garbage": b"<html>"}.get(query, json.dumps(reply).encode())
    self.send_response(200)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


@pytest.fixture(scope="module")
def server_url():
  server = ThreadingHTTPServer(("127.0.0.1", 0), _StubServer)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{server.server_address[1]}"
  server.shutdown()
  server.server_close()


def test_http_client_speaks_search_r1(server_url):
  hits = HttpRetriever(server_url).search("cats", 2)
  assert hits == [retrieval.Passage("Doc 0", "about cats", 1.0), retrieval.Passage("Doc 1", "about cats", 0.5)]


@pytest.mark.parametrize("query, message", [("slow", "did not answer after 2 tries"), ("error", "HTTP 500"),
                                            ("shape", "another format"), ("garbage", "not JSON")])
def test_http_client_errors_are_clear_and_bounded(server_url, query, message):
  client = HttpRetriever(server_url, timeout=0.2, retries=1, backoff=0.01)
  start = time.monotonic()
  with pytest.raises(RetrievalError, match=message):
    client.search(query, 3)
  assert time.monotonic() - start < 1.0


def _questions_file(tmp_path, n=20):
  path = tmp_path / "questions.jsonl"
  path.write_text("".join(json.dumps({"question": f"What is thing {i}?", "answers": ["Doc 0"]}) + "\n"
                          for i in range(n)))
  return str(path)


def test_env_over_a_server_and_a_server_that_fails(server_url, tmp_path):
  env = envs.host.make_text_env("search", questions=_questions_file(tmp_path), server_url=server_url,
                                validation_fraction=0.3, request_retries=0)
  env.reset(1)
  assert "[1] Doc 0: about dogs" in env.step(_act("search[dogs]")).observation
  failed = env.step(_act("search[error]"))  # the server fails mid-episode: the turn shows the error
  assert failed.format_ok and not failed.done and "Search failed" in failed.observation
  assert env.step(_act("finish[doc 0]")).reward == 1.0
  with pytest.raises(ValueError, match="did not answer"):  # nothing listens on port 9 (discard)
    envs.host.make_text_env("search", questions=_questions_file(tmp_path), server_url="http://127.0.0.1:9",
                            request_retries=0)


def test_bad_files_and_options_are_clear_errors(tmp_path, data_dir):
  questions = _questions_file(tmp_path)
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text('{"contents": "\\"A\\"\\ntext a"}\n{"title": "B", "text": \n')
  with pytest.raises(ValueError, match="corpus.jsonl:2: not JSON"):
    envs.host.make_text_env("search", questions=questions, corpus=str(corpus))
  corpus.write_text('{"contents": "\\"A\\"\\ntext a"}\n{"name": "B"}\n')
  with pytest.raises(ValueError, match="corpus.jsonl:2: a corpus record needs"):
    envs.host.make_text_env("search", questions=questions, corpus=str(corpus))
  bad_questions = tmp_path / "bad.jsonl"
  bad_questions.write_text('{"question": "q", "answers": []}\n')
  with pytest.raises(ValueError, match="bad.jsonl:1: answers must be"):
    envs.host.make_text_env("search", questions=str(bad_questions), corpus=str(corpus))
  with pytest.raises(ValueError, match="exactly one of corpus"):
    envs.host.make_text_env("search", questions=questions)
  with pytest.raises(ValueError, match="reward must be"):
    _env(data_dir, reward="bleu")
  with pytest.raises(TypeError):
    _env(data_dir, topk=3)


def test_config_layer_types_and_checks_search_params(data_dir, tmp_path):
  config = load_config_file(os.path.join(ROOT, "configs/search.py"))
  config.model.path = "scratch:tiny"
  config.env.params = {"data_dir": data_dir, "top_k": "2", "generated_people": "200"}  # typed from text
  check_model_and_env(config)
  config.env.params = {"questions": _questions_file(tmp_path), "server_url": "http://127.0.0.1:9",
                       "request_retries": "0"}
  with pytest.raises(ConfigError, match="did not answer"):
    check_model_and_env(config)
