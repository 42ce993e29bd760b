"""Web shopping: WebShop's reward rules written out by hand, the generated store's search finds each goal's
product, a solver reaches full reward through the pages' actions, the page rules, the simulator adapter over a
stand-in `web_agent_site`, WebShop's files converted, and bad input as a format failure or a clear error."""

import json
import os
import sys
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

import envs.host
from envs.host import webshop
from envs.host.webshop import Goal, Product, shopping_reward
from envs.host.webshop_data import convert_webshop, generate, price_upper
from ragen_jax.assembly import check_model_and_env
from ragen_jax.config import ConfigError, load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ = settings(max_examples=150, deadline=None, database=None)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("webshop"))


def _env(data_dir, **options):
  return envs.host.make_text_env("webshop", data_dir=data_dir, **options)


def _act(action: str) -> str:
  return f"<think>ok</think><answer>{action}</answer>"


MUG = Product("B01", "Kavi Dishwasher Safe Ceramic Coffee Mug", "coffee mug", "home › kitchen › coffee mug",
              "coffee mug", ("dishwasher safe", "ceramic"), {"color": ("navy blue", "red"), "size": ("12 oz", "16 oz")},
              12.99, "A mug for hot drinks.", ("Holds 16 oz of coffee.",))
GOAL = Goal("B01", "i need a dishwasher safe ceramic coffee mug in navy, 12 oz", ("dishwasher safe", "ceramic"),
            ("navy", "12 oz"), 20.0)


@pytest.mark.parametrize("product, chosen, upper, expected", [
  (MUG, {"color": "navy blue", "size": "12 oz"}, 20.0, 1.0),  # "navy" is a token subset of "navy blue": fuzzy 100
  (MUG, {"color": "red", "size": "12 oz"}, 20.0, 4 / 5),  # a wrong colour
  (MUG, {"color": "navy blue", "size": "16 oz"}, 20.0, 5 / 5),  # size is exact, but "16 oz" is in its features
  (MUG, {"color": "navy blue"}, 20.0, 4 / 5),  # an option left unchosen
  (MUG, {"color": "navy blue", "size": "12 oz"}, 10.0, 4 / 5),  # over the price bound
  # an insulated mug: neither attribute, the colour and the price (the same query: type reward 1)
  (Product("B02", "Tor Insulated Travel Mug", "coffee mug", "home › kitchen › coffee mug", "coffee mug",
           ("insulated",), {"color": ("navy",)}, 9.0), {"color": "navy"}, 20.0, 2 / 5),
  # another type sharing two category levels: title words "kavi" and "mug" of the goal's 6 content words, > 0.2
  (Product("B03", "Kavi Tea Mug", "tea", "home › kitchen › tea", "tea", (), {}, 5.0), {}, 20.0, 1 / 5 * 1.0),
  # another type, no shared category or query, 1 of 6 title words: 0.1 < 1/6 <= 0.2 -> type reward 0.5
  (Product("B04", "Ceramic Vase", "vase", "garden › decor › vase", "vase", (), {}, 5.0), {}, 20.0, 2 / 5 * 0.5),
  # no title word in common: type reward 0
  (Product("B05", "Steel Hammer", "hammer", "tools › hand tools › hammer", "hammer", (), {}, 5.0), {}, 20.0, 0.0),
])
def test_shopping_reward_follows_webshop_rules(product, chosen, upper, expected):
  goal = Goal(GOAL.product_id, GOAL.instruction, GOAL.attributes, GOAL.options, upper)
  assert shopping_reward(product, chosen, goal, MUG) == pytest.approx(expected)


def test_type_reward_tiers():
  def titled(title, query="other", category="x › y"):
    return Product("B9", title, "", category, query, (), {}, 1.0)
  wanted = titled("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda", "q", "a › b › c")
  assert webshop.type_reward(titled("alpha"), wanted) == 0.1  # 1/11 of the words: under a tenth
  assert webshop.type_reward(titled("alpha beta"), wanted) == 0.5  # 2/11: no query, category or > 0.2 match
  assert webshop.type_reward(titled("alpha beta", query="q"), wanted) == 1.0
  assert webshop.type_reward(titled("alpha beta", category="a › b › z"), wanted) == 1.0
  assert webshop.type_reward(titled("alpha beta gamma"), wanted) == 1.0  # 3/11 > 0.2
  assert webshop.type_reward(titled("mu nu"), wanted) == 0.0


def test_price_bound_is_webshops():
  import random
  bounds = {price_upper(12.5, random.Random(seed)) for seed in range(50)}
  assert bounds == {30.0, 40.0, 50.0}  # the larger of two of 20, 30, 40, 50
  assert price_upper(985.0, random.Random(0)) == 1_000_000.0  # fewer than two steps above


def test_generated_store_is_deterministic_and_unambiguous():
  catalog, instructions = generate(seed=3, products=64)
  assert (catalog, instructions) == generate(seed=3, products=64) and generate(seed=4, products=64)[0] != catalog
  assert len({p["id"] for p in catalog}) == 64 == len(instructions)
  by_type = {}
  for product in catalog:
    key = frozenset(product["attributes"])
    assert key not in by_type.setdefault(product["category"], set())
    by_type[product["category"]].add(key)
  for goal, product in zip(instructions, catalog):
    assert goal["id"] == product["id"] and goal["attributes"] == product["attributes"]
    assert all(any(o in values for values in product["options"].values()) for o in goal["options"])
    assert product["price"] <= goal["price_upper"] and f"{goal['price_upper']:.2f} dollars" in goal["instruction"]
  with pytest.raises(ValueError, match="holds 1 to 160 products"):
    generate(products=161)


def test_search_finds_each_goals_product(data_dir):
  env = _env(data_dir)
  goals = env.goals("train") + env.goals("validation")
  ranks = []
  for goal in goals:
    product = env.shop.store.product(goal.product_id)
    hits = [p.id for p in env.shop.store.search(f"{' '.join(goal.attributes)} {product.category}", 50)]
    ranks.append(hits.index(goal.product_id) if goal.product_id in hits else 50)
  print(f"goal's product at rank 1 for {ranks.count(0)}/{len(goals)}, on page 1 for {sum(r < 10 for r in ranks)}")
  assert ranks.count(0) >= 0.8 * len(goals) and max(ranks) < 10


def _solve(env, seed: int, split: str):
  """Search the goal's attributes, open results whose title has them all within the price, choose the goal's
  options where the product offers them all, buy."""
  env.reset(seed, split)
  goal = env.goals(split)[seed % len(env.goals(split))]
  kind = env.shop.store.product(goal.product_id).category
  step = env.step(_act(f"search[{' '.join(goal.attributes)} {kind}]"))
  tried = set()
  while True:
    candidates = [line for line in step.observation.splitlines() if line.startswith("[B0")]
    fit = [line[1:11] for line in candidates if all(a in line.lower() for a in goal.attributes)
           and float(line.rsplit("$", 1)[1]) <= goal.price_upper and line[1:11] not in tried]
    if not fit:
      assert "[Next >]" in step.observation, "the goal's product is not among the results"
      step = env.step(_act("click[Next >]"))
      continue
    tried.add(fit[0])
    page = env.step(_act(f"click[{fit[0]}]")).observation
    if all(f"[{option}]" in page for option in goal.options):
      for option in goal.options:
        step = env.step(_act(f"click[{option}]"))
        assert f"(chosen: {option})" in step.observation
      return env.step(_act("click[Buy Now]"))
    step = env.step(_act("click[< Prev]"))


def test_solver_reaches_full_reward_through_the_actions(data_dir):
  env = _env(data_dir)
  for split in ("train", "validation"):
    for seed in range(len(env.goals(split))):
      step = _solve(env, seed, split)
      assert (step.reward, step.success, step.done, step.format_ok) == (1.0, True, True, True)


def test_page_rules(data_dir):
  env = _env(data_dir, max_turns=8, results_per_page=5)
  first = env.reset(0)
  assert first.startswith("Instruction: ") and first.endswith("Available actions: search[<keywords>]")
  for bad in ("no tags", _act("search[]"), _act("click[  ]"), _act("buy[x]"), _act("search[a] click[b]"),
              _act("I pick click[buy now]"), _act("click[buy now]")):  # nothing to click on the search page
    step = env.step(bad)
    assert (step.format_ok, step.reward, step.done) == (False, 0.0, False) and step.observation == first
  results = env.step(_act("search[coffee mug]")).observation
  assert "Page 1 (Total results: " in results and "[Next >]" in results and "[< Prev]" not in results
  assert not env.step(_act("search[pillow]")).format_ok  # no search bar on the results page
  assert not env.step(_act("click[b0nothere00]")).format_ok
  second = env.step(_act("click[next >]")).observation
  assert "Page 2 " in second and "[< Prev]" in second and second != results
  assert env.step(_act("click[< prev]")).observation == results
  product_id = results.split("\n[B0", 1)[1][:8]
  item = env.step(_act(f"CLICK[ b0{product_id} ]")).observation
  assert "[Buy Now]" in item and "Price: $" in item
  assert env.step(_act("click[features]")).observation.splitlines()[2].startswith("Features: ")
  assert env.step(_act("click[< Prev]")).observation == item
  assert env.step(_act("click[back to search]")).observation == first
  last = env.step(_act("search[mug]"))  # the 8th valid action of 8, not a purchase: the episode ends unpaid
  assert (last.done, last.reward, last.success) == (True, 0.0, False)
  with pytest.raises(RuntimeError, match="reset"):
    env.step(_act("search[mug]"))


@FUZZ
@given(text=st.text(max_size=80) | st.builds(lambda k, a: f"{k}[{a}]", st.sampled_from(["search", "click", "Click"]),
                                             st.text(max_size=30)))
def test_action_parser_and_steps_never_crash(data_dir, text):
  action = webshop.parse_action(text)
  assert action is None or (action[0] in ("search", "click") and action[1] and action[1] == action[1].strip())
  env = _env(data_dir)
  env.reset(len(text))
  env.step(_act("search[ceramic mug]"))
  step = env.step(_act(text))
  assert 0.0 <= step.reward <= 1.0 and (action is not None or not step.format_ok)


def _catalog(tmp_path, lines):
  path = tmp_path / "catalog.jsonl"
  path.write_text("".join(line + "\n" for line in lines))
  return str(path)


def test_bad_files_and_options_are_clear_errors(tmp_path, data_dir):
  good = json.dumps({"id": "b1", "title": "Mug", "price": 3, "options": {"size": ["s"]}})
  instructions = tmp_path / "instructions.jsonl"
  instructions.write_text(json.dumps({"id": "B1", "instruction": "a mug", "attributes": []}) + "\n")
  cases = [([good, '{"id": "b2", "title": '], "catalog.jsonl:2: not JSON"),
           ([good, json.dumps({"id": "b2", "title": "Cup", "price": "cheap"})], "catalog.jsonl:2: a product needs"),
           ([good, json.dumps({"title": "Cup", "price": 1})], r"catalog.jsonl:2: needs one of the keys \['id'"),
           ([good, good.replace("b1", "B1")], "B1 appears twice")]
  for number, (lines, message) in enumerate(cases):
    folder = tmp_path / str(number)
    folder.mkdir()
    with pytest.raises(ValueError, match=message):
      envs.host.make_text_env("webshop", catalog=_catalog(folder, lines), instructions=str(instructions))
  catalog = _catalog(tmp_path, [good])
  instructions.write_text(json.dumps({"id": "B7", "instruction": "a cup", "attributes": []}) + "\n")
  with pytest.raises(ValueError, match="instructions.jsonl:1: the instruction's product B7 is not in the catalog"):
    envs.host.make_text_env("webshop", catalog=catalog, instructions=str(instructions))
  instructions.write_text(json.dumps({"id": "B1", "instruction": "a mug", "attributes": []}) + "\n")
  with pytest.raises(ValueError, match="split of .*instructions.jsonl is empty .* give validation_instructions"):
    envs.host.make_text_env("webshop", catalog=catalog, instructions=str(instructions))  # one goal, two splits
  with pytest.raises(ValueError, match="needs an instructions file"):
    envs.host.make_text_env("webshop", catalog=catalog)
  with pytest.raises(FileNotFoundError, match="catalog not found"):
    envs.host.make_text_env("webshop", catalog=str(tmp_path / "none.jsonl"), instructions=str(instructions))
  with pytest.raises(ValueError, match="backend must be"):
    _env(data_dir, backend="amazon")
  with pytest.raises(TypeError):
    _env(data_dir, top_k=3)


def test_simulator_backend_absent_is_a_clear_error(data_dir, monkeypatch):
  monkeypatch.setitem(sys.modules, "web_agent_site", None)  # not importable
  webshop._simulator_server.cache_clear()
  with pytest.raises(ValueError, match="needs WebShop's simulator .* not importable here"):
    _env(data_dir, backend="simulator")


_STAND_IN = '''
class _Server:
  def __init__(self, num_products):
    self.goals = [f"goal {i}" for i in range(num_products)]

class WebAgentTextEnv:
  """A stand-in with WebShop's text-env interface: reset(session) shows the goal, one search, then Buy Now."""
  def __init__(self, observation_mode="html", server=None, num_products=None, human_goals=True):
    assert observation_mode == "text"
    self.server = server or _Server(num_products)
    self.page = "search"

  def reset(self, session=None):
    self.goal, self.page = self.server.goals[session], "search"
    return f"WebShop [SEP] Instruction: [SEP] {self.goal} [SEP] Search", None

  def get_available_actions(self):
    if self.page == "search":
      return {"has_search_bar": True, "clickables": ["search"]}
    return {"has_search_bar": False, "clickables": ["back to search", "b0sim00001", "buy now"]}

  def step(self, action):
    if action == "click[buy now]":
      return "Thank you for shopping [SEP] Your score: 0.5", 0.5, True, None
    self.page = "results"
    return f"[SEP] Back to Search [SEP] B0SIM00001 [SEP] {action}", 0.0, False, None
'''


def test_simulator_backend_through_a_stand_in(tmp_path, monkeypatch):
  package = tmp_path / "web_agent_site" / "envs"
  package.mkdir(parents=True)
  (tmp_path / "web_agent_site" / "__init__.py").write_text("")
  (package / "__init__.py").write_text("")
  (package / "web_agent_text_env.py").write_text(textwrap.dedent(_STAND_IN))
  monkeypatch.syspath_prepend(str(tmp_path))
  webshop._simulator_server.cache_clear()
  try:
    env = envs.host.make_text_env("webshop", backend="simulator", simulator_products=12,
                                  simulator_validation_goals=10)
    assert len(env.goals("train")) == 2 and len(env.goals("validation")) == 10
    first = env.reset(1, "train")  # the second train goal: goal 11
    assert "goal 11" in first and first.endswith("Available actions: search[<keywords>]")
    assert not env.step(_act("click[search]")).format_ok
    results = env.step(_act("search[a mug]"))
    assert "search[a mug]" in results.observation and "click[b0sim00001], click[buy now]" in results.observation
    assert not env.step(_act("search[again]")).format_ok
    bought = env.step(_act("click[Buy Now]"))
    assert (bought.done, bought.reward, bought.success) == (True, 0.5, False)
  finally:
    webshop._simulator_server.cache_clear()
    for name in [m for m in sys.modules if m.startswith("web_agent_site")]:
      del sys.modules[name]


def test_webshop_files_convert(tmp_path, data_dir):
  items = [{"asin": "B000MUG001", "name": "Kavi Ceramic Coffee Mug, Dishwasher Safe", "category": "home",
            "query": " Coffee Mug ", "product_category": "Home › Kitchen › Mugs", "pricing": "$12.99 - $15.00",
            "customization_options": {"Color": [{"value": "Navy/Blue", "image": None}], "Size": None},
            "small_description": ["Holds 12 oz"], "full_description": "A mug.", "images": [""]},
           {"asin": "nan", "name": "skipped"}, {"asin": "B000MUG001", "name": "a duplicate"}]
  attributes = {"B000MUG001": {"attributes": ["dishwasher safe"]}}
  human = {"B000MUG001": [{"instruction": "i want a navy blue dishwasher safe mug.",
                           "instruction_attributes": ["dishwasher safe"], "instruction_options": ["navy | blue"]},
                          {"instruction": "no attributes", "instruction_attributes": []}]}
  files = []
  for name, value in (("items.json", items), ("attributes.json", attributes), ("human.json", human)):
    (tmp_path / name).write_text(json.dumps(value))
    files.append(str(tmp_path / name))
  catalog, instructions = convert_webshop(*files, str(tmp_path / "out"))
  [product] = [json.loads(line) for line in open(catalog)]
  assert product["options"] == {"color": ["navy | blue"]} and product["price"] == 12.99
  assert product["query"] == "coffee mug" and product["attributes"] == ["dishwasher safe"]
  [goal] = [json.loads(line) for line in open(instructions)]
  assert goal["instruction"].startswith("i want a navy blue dishwasher safe mug, and price lower than ")
  env = envs.host.make_text_env("webshop", catalog=catalog, instructions=instructions,
                                validation_instructions=instructions)
  env.reset(0)
  env.step(_act("search[dishwasher safe mug]"))
  env.step(_act("click[b000mug001]"))
  env.step(_act("click[navy | blue]"))
  assert env.step(_act("click[buy now]")).reward == 1.0


def test_config_layer_types_and_checks_webshop_params(data_dir):
  config = load_config_file(os.path.join(ROOT, "configs/webshop.py"))
  assert (config.rollout.max_turns, config.rollout.max_model_len) == (9, 15000)
  config.model.path = "scratch:tiny"
  config.env.params = {"data_dir": data_dir, "results_per_page": "5", "generated_products": "120"}  # typed from text
  check_model_and_env(config)
  config.env.params = {"data_dir": data_dir, "backend": "amazon"}
  with pytest.raises(ConfigError, match="backend must be"):
    check_model_and_env(config)
