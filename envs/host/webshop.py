"""Web shopping as WebShop plays it: search the store, click through results and a product's options, buy.

Pages are text. Each turn's answer block holds one action, `search[keywords]` (on the search page) or
`click[button]` for a button the page shows in brackets (case-insensitive):
  search page   `[Search]`
  results page  `[Back to Search]`, `[< Prev]`/`[Next >]` between pages of `results_per_page`, one `[<id>]`
                per product (title and price beside it), of the best `search_results` BM25 hits
  product page  `[Back to Search]`, `[< Prev]` (to the results), one `[<value>]` per option value (clicking
                one chooses it for its option), `[Description]`, `[Features]`, `[Buy Now]`
  detail page   the description or the features, `[< Prev]` (to the product)
Buying ends the episode with WebShop's reward (`shopping_reward`); success is a reward of 1. Anything else
(no action, two actions, an empty argument, a search off the search page, a click on what the page does not
show) is a format failure: reward 0, the same page again, and the rollout applies the format penalty. The
`max_turns`-th valid action that is not a purchase ends the episode with reward 0 (RAGEN's 9 turns,
`config/_6_webshop.yaml`).

Two back ends behind the same actions:
* `backend="catalog"` (default): `CatalogStore`, BM25 (bm25s) over a product catalog JSONL, and the pages
  above, with goals from an instructions JSONL (formats in `envs.host.webshop_data`). Without `catalog`, a
  generated store (`generated_seed`, `generated_products`) is written into `data_dir` (default: `webshop/` in
  the host's cache). WebShop's own product data converts to these files with `webshop_data.convert_webshop`.
* `backend="simulator"`: WebShop's own simulator (`web_agent_site`, installed with its data and search index
  from github.com/princeton-nlp/WebShop) in its text mode, `simulator_products` products; its first
  `simulator_validation_goals` goals (WebShop's test goals) are the validation split, the rest train.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from envs.host.base import TextStep, check_split, extract_answer, format_failure, split_index
from envs.host.records import existing_file, field, file_digest, hash_split, read_records
from envs.host.retrieval import bm25_index, bm25_top
from envs.host.webshop_data import write_generated
from ragen_jax import paths

INSTRUCTION = (
  "You are shopping in a web store for the item an instruction describes. Each turn, give exactly one action: "
  "search[keywords] on the search page, or click[button] for a button the page shows in brackets (a product id, "
  "an option value, Next >, < Prev, Back to Search, Description, Features, Buy Now). Buy the item that matches "
  "the instruction, choosing the options it asks for, within its price. Example answer format: <think> I should "
  "search for the item first. </think><answer>search[aluminum free deodorant]</answer>"
)
SEARCH, BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "search", "back to search", "next >", "< prev", "buy now"
DETAILS = ("description", "features")
_LABELS = {PREV_PAGE: "< Prev", NEXT_PAGE: "Next >", "description": "Description", "features": "Features"}
EXACT_MATCH_OPTIONS = ("size",)  # WebShop matches these options exactly, the others fuzzily
FUZZY_THRESHOLD = 85  # WebShop's token-set-ratio threshold for a match
_ACTION_START = re.compile(r"(search|click)\[", re.IGNORECASE)
_WORD = re.compile(r"[a-z]+")


@dataclasses.dataclass(frozen=True)
class WebShopOptions:
  """The web-shopping env's settings (`env.params`); "" means unset."""

  backend: str = "catalog"  # "catalog" (a product JSONL) or "simulator" (WebShop's own package)
  catalog: str = ""  # product JSONL; "" = the generated store
  instructions: str = ""  # goal JSONL for `catalog`
  validation_instructions: str = ""
  validation_fraction: float = 0.1
  max_turns: int = 9
  results_per_page: int = 10  # WebShop's PRODUCT_WINDOW
  search_results: int = 50  # WebShop's SEARCH_RETURN_N
  generated_seed: int = 0
  generated_products: int = 120
  data_dir: str = ""  # where the generated store is written ("" = `webshop/` in the host's cache)
  simulator_products: int = 1000  # WebShop's index sizes: 100, 1000, 100000
  simulator_validation_goals: int = 500


@dataclasses.dataclass(frozen=True)
class Product:
  id: str
  title: str
  category: str
  product_category: str  # "a › b › c"
  query: str
  attributes: tuple[str, ...]
  options: dict  # option name -> tuple of values
  price: float
  description: str = ""
  features: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Goal:
  product_id: str  # the product the instruction was written for
  instruction: str
  attributes: tuple[str, ...]
  options: tuple[str, ...]
  price_upper: float


def parse_action(text: str) -> tuple[str, str] | None:
  """("search" | "click", argument) of an answer block holding exactly one action with a non-empty argument
  (whitespace collapsed, a click's argument lower case); None for anything else."""
  text = text.strip()
  start = _ACTION_START.match(text)
  if not start or not text.endswith("]"):
    return None
  argument = " ".join(text[start.end() : -1].split())
  if not argument or _ACTION_START.search(argument):
    return None
  kind = start.group(1).lower()
  return kind, argument.lower() if kind == "click" else argument


def _fuzzy(a: str, b: str) -> bool:
  from rapidfuzz import fuzz

  return fuzz.token_set_ratio(a, b) > FUZZY_THRESHOLD


def title_words(title: str) -> set[str]:
  """The content words of a title: lower-case alphabetic words that are not English stop words.

  WebShop keeps the nouns spaCy's large English model tags; this needs no model and keeps adjectives too."""
  from bm25s.stopwords import STOPWORDS_EN

  return set(_WORD.findall(title.lower())) - set(STOPWORDS_EN)


def type_reward(product: Product, wanted: Product) -> float:
  """WebShop's `get_type_reward`: 1, lowered to 0.5 when neither the query, two category levels nor more than a
  fifth of the wanted title's words match, to 0.1 when under a tenth of the words match, 0 when none do."""
  query_match = product.query == wanted.query
  category_match = len({c.strip() for c in product.product_category.split("›")}
                       & {c.strip() for c in wanted.product_category.split("›")}) >= 2
  desired = title_words(wanted.title)
  title_score = len(title_words(product.title) & desired) / len(desired) if desired else 0.2
  if title_score == 0.0:
    return 0.0
  if title_score < 0.1:
    return 0.1
  return 1.0 if query_match or category_match or title_score > 0.2 else 0.5


def _in_text(value: str, product: Product) -> bool:
  return any(value in text.lower() for text in (product.title, " ".join(product.features), product.description))


def attribute_matches(product: Product, attributes) -> int:
  """WebShop's `get_attribute_reward` count: goal attributes that fuzzily match one of the product's attributes
  or appear in its title, features or description."""
  return sum(any(_fuzzy(have, want) for have in product.attributes) or _in_text(want, product)
             for want in attributes)


def option_matches(product: Product, chosen: dict, options) -> int:
  """WebShop's `get_option_reward` count over the chosen options (size exactly, the others fuzzily, else found
  in the product's text), at most the number of goal options."""
  count = 0
  for name, value in chosen.items():
    matched = value in options if name.lower() in EXACT_MATCH_OPTIONS else any(_fuzzy(o, value) for o in options)
    count += matched or _in_text(value, product)
  return min(count, len(options))


def shopping_reward(product: Product, chosen: dict, goal: Goal, wanted: Product) -> float:
  """WebShop's `get_reward`: (attribute matches + option matches + [price <= bound]) / (attributes + options + 1),
  times the type reward. `wanted`: the product the goal was written for (its query, category and title)."""
  price_ok = float(product.price <= goal.price_upper)
  matched = attribute_matches(product, goal.attributes) + option_matches(product, chosen, goal.options) + price_ok
  return matched / (len(goal.attributes) + len(goal.options) + 1) * type_reward(product, wanted)


def _product(record: dict, place: str) -> Product:
  product_id, title = str(field(record, ("id", "asin"), place)).upper(), str(field(record, ("title", "name"), place))
  options, price = record.get("options") or {}, record.get("price")
  try:
    product = Product(
      id=product_id, title=title, category=str(record.get("category", "")),
      product_category=str(record.get("product_category", "")),
      query=str(record.get("query", "")).lower().strip(),
      attributes=tuple(str(a).lower() for a in record.get("attributes") or ()),
      options={str(k).lower(): tuple(str(v).lower() for v in values) for k, values in options.items()},
      price=float(price[0] if isinstance(price, list) else price), description=str(record.get("description", "")),
      features=tuple(str(f) for f in record.get("features") or ()))
  except (TypeError, ValueError, AttributeError, IndexError) as error:
    raise ValueError(f"{place}: a product needs id, title, a numeric price and options as "
                     f"{{name: [values]}} ({error})") from error
  if not product.id or not product.title.strip():
    raise ValueError(f"{place}: the product's id and title must be non-empty")
  return product


def _goal(record: dict, place: str, products: dict) -> Goal:
  product_id = str(field(record, ("id", "asin"), place)).upper()
  if product_id not in products:
    raise ValueError(f"{place}: the instruction's product {product_id} is not in the catalog")
  instruction = field(record, ("instruction", "instruction_text"), place)
  attributes, options = record.get("attributes") or [], record.get("options") or []
  options = list(options.values()) if isinstance(options, dict) else options
  if not isinstance(instruction, str) or not instruction.strip() or not isinstance(attributes, list):
    raise ValueError(f"{place}: an instruction needs a non-empty instruction text and a list of attributes")
  return Goal(product_id, instruction.strip(), tuple(str(a).lower() for a in attributes),
              tuple(str(o).lower() for o in options), float(record.get("price_upper", 1_000_000.0)))


class CatalogStore:
  """The products of a catalog JSONL and a BM25 index over their titles, descriptions and features (saved beside
  the catalog, `envs.host.retrieval.bm25_index`); build with `CatalogStore.for_catalog` (cached per process)."""

  def __init__(self, products: tuple[Product, ...], index):
    self.products, self._index = products, index
    self._by_id = {p.id: p for p in products}

  @classmethod
  def for_catalog(cls, catalog: str) -> CatalogStore:
    catalog = existing_file(catalog, "webshop catalog")
    return _catalog_store(catalog, file_digest(catalog))

  def search(self, query: str, k: int) -> list[Product]:
    return [self.products[i] for i, _ in bm25_top(self._index, query, k)]

  def product(self, product_id: str) -> Product:
    return self._by_id[product_id.upper()]

  def __contains__(self, product_id: str) -> bool:
    return product_id.upper() in self._by_id


@functools.cache
def _catalog_store(catalog: str, digest: str) -> CatalogStore:
  products = tuple(_product(record, place) for place, record in read_records(catalog))
  if not products:
    raise ValueError(f"{catalog} has no products")
  seen = set()
  for product in products:
    if product.id in seen:
      raise ValueError(f"{catalog}: product id {product.id} appears twice")
    seen.add(product.id)
  texts = [f"{p.title}\n{p.description}\n{' '.join(p.features)}" for p in products]
  return CatalogStore(products, bm25_index(catalog, digest, texts))


@functools.cache
def _goals(instructions: str, catalog: str, digest: str) -> tuple[Goal, ...]:
  del digest  # the cache key only
  store = CatalogStore.for_catalog(catalog)
  goals = tuple(_goal(record, place, store) for place, record in read_records(instructions))
  if not goals:
    raise ValueError(f"{instructions} has no instructions")
  return goals


def _buttons(names) -> str:
  return " ".join(f"[{name}]" for name in names)


class CatalogShop:
  """WebShop's pages (module docstring) over a `CatalogStore` for one goal at a time."""

  def __init__(self, store: CatalogStore, results_per_page: int, search_results: int):
    self.store, self.per_page, self.search_results = store, results_per_page, search_results
    self.goal: Goal | None = None

  def start(self, goal: Goal) -> None:
    self.goal, self.page, self.hits, self.page_number = goal, "search", [], 1
    self.product: Product | None = None
    self.chosen: dict[str, str] = {}
    self.detail = ""

  def _shown(self) -> list[Product]:
    return self.hits[(self.page_number - 1) * self.per_page : self.page_number * self.per_page]

  @property
  def has_search(self) -> bool:
    return self.page == "search"

  def _paging(self) -> list[str]:
    return [PREV_PAGE] * (self.page_number > 1) + [NEXT_PAGE] * (self.page_number * self.per_page < len(self.hits))

  def clickables(self) -> list[str]:
    if self.page == "results":
      return [BACK_TO_SEARCH, *self._paging(), *(p.id.lower() for p in self._shown())]
    if self.page == "item":
      values = [v for values in self.product.options.values() for v in values]
      return [BACK_TO_SEARCH, PREV_PAGE, *values, *DETAILS, BUY_NOW]
    return [PREV_PAGE] if self.page == "detail" else []

  def observation(self) -> str:
    head = f"Instruction: {self.goal.instruction}\n"
    if self.page == "search":
      return head + "[Search]"
    if self.page == "results":
      paging = _buttons(_LABELS[name] for name in self._paging())
      lines = [f"[{p.id}] {p.title} | ${p.price:.2f}" for p in self._shown()]
      return "\n".join([head + "[Back to Search]", f"Page {self.page_number} (Total results: {len(self.hits)})",
                        *([paging] if paging else []), *lines])
    product = self.product
    if self.page == "detail":
      text = product.description if self.detail == "description" else "\n".join(product.features)
      return head + f"[< Prev]\n{_LABELS[self.detail]}: {text}"
    options = [f"{name}: {_buttons(values)}" + (f" (chosen: {self.chosen[name]})" if name in self.chosen else "")
               for name, values in product.options.items()]
    return (head + "[Back to Search] [< Prev]\n" + "".join(o + "\n" for o in options)
            + f"{product.title}\nPrice: ${product.price:.2f}\n[Description] [Features] [Buy Now]")

  def act(self, kind: str, argument: str) -> tuple[float, bool]:
    """Applies an action `allowed` returned True for; (reward, done)."""
    if kind == SEARCH:
      self.page, self.page_number = "results", 1
      self.hits = self.store.search(argument, self.search_results)
    elif argument == BACK_TO_SEARCH:
      self.page = "search"
    elif argument == NEXT_PAGE:
      self.page_number += 1
    elif argument == PREV_PAGE:
      if self.page == "results":
        self.page_number -= 1
      else:
        self.page = "results" if self.page == "item" else "item"
    elif argument == BUY_NOW:
      return shopping_reward(self.product, self.chosen, self.goal, self.store.product(self.goal.product_id)), True
    elif argument in DETAILS:
      self.page, self.detail = "detail", argument
    elif self.page == "results":
      self.page, self.product, self.chosen = "item", self.store.product(argument), {}
    else:  # an option value: chosen for the first option that offers it
      name = next(name for name, values in self.product.options.items() if argument in values)
      self.chosen[name] = argument
    return 0.0, False


class SimulatorShop:
  """WebShop's simulator (`web_agent_site`) in its text mode behind `CatalogShop`'s interface; one shared
  `SimServer` per process (products, goals and search index load once)."""

  def __init__(self, products: int):
    server = _simulator_server(products)  # first: a clear error when WebShop is not installed
    from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv

    self._env = WebAgentTextEnv(observation_mode="text", server=server)
    self.goals = len(self._env.server.goals)

  def _show(self, observation: str) -> None:
    """The new page: its text and, parsed once from its HTML, what it allows."""
    available = self._env.get_available_actions()
    self._observation, self.has_search = observation, bool(available["has_search_bar"])
    self._clickables = [c for c in available["clickables"] if c != SEARCH]

  def start(self, goal_index: int) -> None:
    self._show(self._env.reset(session=goal_index)[0])

  def clickables(self) -> list[str]:
    return self._clickables

  def observation(self) -> str:
    return self._observation

  def act(self, kind: str, argument: str) -> tuple[float, bool]:
    observation, reward, done, _ = self._env.step(f"{kind}[{argument}]")
    self._show(observation)
    return float(reward), bool(done)


@functools.cache
def _simulator_server(products: int):
  try:
    from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
  except ImportError as error:
    raise ValueError("webshop backend='simulator' needs WebShop's simulator (the web_agent_site package from "
                     "github.com/princeton-nlp/WebShop, installed with its data and search index); it is not "
                     f"importable here ({error}). Use backend='catalog' with a catalog JSONL instead") from error
  return WebAgentTextEnv(observation_mode="text", num_products=products, human_goals=True).server


def render(shop) -> str:
  """The page and the actions it allows."""
  actions = (["search[<keywords>]"] if shop.has_search else []) + [f"click[{c}]" for c in shop.clickables()]
  return f"{shop.observation()}\nAvailable actions: {', '.join(actions)}"


class WebShopEnv:
  """One shopping episode; `reset(seed)` picks goal seed mod split size."""

  name = "webshop"
  instruction = INSTRUCTION
  OPTIONS = WebShopOptions

  def __init__(self, **options):
    """`options`: `WebShopOptions` fields (unknown ones raise TypeError); the data is read and checked here."""
    self.options = o = WebShopOptions(**options)
    if o.backend not in ("catalog", "simulator"):
      raise ValueError(f"webshop backend must be 'catalog' or 'simulator', got {o.backend!r}")
    if min(o.max_turns, o.results_per_page, o.search_results) < 1 or not 0.0 <= o.validation_fraction < 1.0:
      raise ValueError("webshop env needs max_turns, results_per_page, search_results >= 1 and validation_fraction "
                       "in [0, 1)")
    self.max_turns = o.max_turns
    if o.backend == "simulator":
      self.shop = SimulatorShop(o.simulator_products)
      if self.shop.goals <= o.simulator_validation_goals:
        raise ValueError(f"the simulator has {self.shop.goals} goals, not more than simulator_validation_goals="
                         f"{o.simulator_validation_goals}")
      self._splits = {"validation": range(o.simulator_validation_goals),
                      "train": range(o.simulator_validation_goals, self.shop.goals)}
    else:
      catalog, instructions = o.catalog, o.instructions
      if not catalog:
        if instructions or o.validation_instructions:
          raise ValueError("instructions and validation_instructions need a catalog; without one the env uses its "
                           "generated store")
        catalog, instructions = write_generated(o.data_dir or paths.join(paths.default_cache_root(), "webshop"),
                                                o.generated_seed, o.generated_products)
      if not instructions:
        raise ValueError("a webshop catalog needs an instructions file (goals naming its products)")
      self.shop = CatalogShop(CatalogStore.for_catalog(catalog), o.results_per_page, o.search_results)
      instructions, validation = (path and existing_file(path, "webshop instructions")
                                  for path in (instructions, o.validation_instructions))
      self._splits = _split(paths.join(catalog), instructions, validation, o.validation_fraction,
                            file_digest(catalog, instructions, validation))
    self._turn, self._done, self._started = 0, False, False

  def goals(self, split: str = "train"):
    """The goals (catalog) or goal indices (simulator) of `split`."""
    return self._splits[check_split(split)]

  def reset(self, seed: int, split: str = "train") -> str:
    table = self.goals(split)
    self.shop.start(table[split_index(seed, len(table))])
    self._turn, self._done, self._started = 0, False, True
    self._observation = render(self.shop)
    return self._observation

  def step(self, response: str, enable_think: bool = True) -> TextStep:
    if not self._started or self._done:
      raise RuntimeError("no episode running: call reset() first")
    answer = extract_answer(response, enable_think)
    action = parse_action(answer) if answer is not None else None
    if action is None:
      return format_failure(self._observation)
    kind, argument = action
    if not (self.shop.has_search if kind == SEARCH else argument in self.shop.clickables()):
      return format_failure(self._observation, {"answer": answer, "invalid_action": f"{kind}[{argument}]"})
    self._turn += 1
    reward, done = self.shop.act(kind, argument)
    info = {"answer": answer, "action": kind}
    if done or self._turn >= self.max_turns:
      self._done = True
      return TextStep("", reward, True, reward >= 1.0, True, info)
    self._observation = render(self.shop)
    return TextStep(self._observation, 0.0, False, False, True, info)


@functools.cache
def _split(catalog: str, instructions: str, validation_instructions: str, fraction: float,
           digest: str) -> dict[str, tuple[Goal, ...]]:
  if validation_instructions:
    return {"train": _goals(instructions, catalog, digest), "validation": _goals(validation_instructions, catalog,
                                                                                  digest)}
  return hash_split(_goals(instructions, catalog, digest), lambda g: g.instruction + g.product_id, fraction,
                    instructions, "validation_instructions")
