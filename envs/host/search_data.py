"""A generated multi-hop QA set over a generated corpus, for offline tests and demos (deterministic from a seed).

The corpus has one passage per fictional person, titled with the person's name:
  "Velmor Quastine was born in Drelhaven. Velmor Quastine works for Ostrin Mills. The mentor of Velmor Quastine
  is Tavrel Umbrick."
Every question is two-hop: "In which city was the mentor of Velmor Quastine born?" needs one search for Velmor
Quastine (to read the mentor's name) and one for Tavrel Umbrick (to read the city). Its supporting titles are the
two people, in the order they are needed.
"""

from __future__ import annotations

import random

from envs.host.records import write_jsonl
from ragen_jax import paths

_ONSETS = ("b", "br", "d", "dr", "f", "g", "k", "kr", "l", "m", "n", "p", "qu", "r", "s", "st", "t", "tr", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou")
_CODAS = ("", "l", "n", "r", "s", "th", "x", "nd", "rk")
QUESTIONS = {  # relation -> question about the mentor of the named person
  "city": "In which city was the mentor of {name} born?",
  "employer": "Which company does the mentor of {name} work for?",
}


def _word(rng: random.Random, syllables: int) -> str:
  return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).title()


def _distinct(rng: random.Random, count: int, make) -> list[str]:
  names: list[str] = []
  while len(names) < count:
    name = make()
    if name not in names:
      names.append(name)
  return names


def generate(seed: int = 0, people: int = 200) -> tuple[list[dict], list[dict]]:
  """(corpus records {"title", "text"}, question records {"question", "answers", "supporting_titles"})."""
  if people < 2:
    raise ValueError(f"the generated set needs at least 2 people, got {people}")
  rng = random.Random(seed)
  names = _distinct(rng, people, lambda: f"{_word(rng, 2)} {_word(rng, 3)}")
  cities = _distinct(rng, max(4, people // 8), lambda: _word(rng, 2) + rng.choice(("haven", "ford", "mere", "holt")))
  companies = _distinct(rng, max(4, people // 8), lambda: f"{_word(rng, 2)} {rng.choice(('Mills', 'Works', 'Guild'))}")
  facts = {name: {"city": rng.choice(cities), "employer": rng.choice(companies)} for name in names}
  mentors = {name: rng.choice([other for other in names if other != name]) for name in names}
  corpus = [{"title": name, "text": f"{name} was born in {facts[name]['city']}. {name} works for "
                                    f"{facts[name]['employer']}. The mentor of {name} is {mentors[name]}."}
            for name in names]
  questions = []
  for name in names:
    relation = rng.choice(sorted(QUESTIONS))
    questions.append({"question": QUESTIONS[relation].format(name=name), "answers": [facts[mentors[name]][relation]],
                      "supporting_titles": [name, mentors[name]]})
  return corpus, questions


def write_generated(directory: str, seed: int = 0, people: int = 200) -> tuple[str, str]:
  """(corpus path, questions path) of the generated set in `directory/generated-seed{seed}-people{people}/`,
  written once."""
  folder = paths.join(directory, f"generated-seed{seed}-people{people}")
  corpus_path, questions_path = paths.join(folder, "corpus.jsonl"), paths.join(folder, "questions.jsonl")
  if not (paths.exists(corpus_path) and paths.exists(questions_path)):
    corpus, questions = generate(seed, people)
    write_jsonl(corpus_path, corpus)
    write_jsonl(questions_path, questions)
  return corpus_path, questions_path
