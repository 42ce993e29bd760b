"""Catalogs and shopping instructions for the web-shopping env: a generated store, and WebShop's files converted.

A catalog is JSONL, one product per line:
  {"id": "B0F3K2Q7XA", "title": "Velmor Aluminum Free Sensitive Skin Deodorant", "category": "deodorant",
   "product_category": "beauty › personal care › deodorant", "query": "deodorant",
   "attributes": ["aluminum free", "sensitive skin"], "options": {"scent": ["citrus", "cedar"], "size": ["3 oz"]},
   "price": 12.99, "description": "...", "features": ["...", ...]}
and the instructions JSONL, one goal per line, naming the product it was written for:
  {"id": "B0F3K2Q7XA", "instruction": "i need an aluminum free ... and price lower than 20.00 dollars",
   "attributes": ["aluminum free", "sensitive skin"], "options": ["citrus", "3 oz"], "price_upper": 20.0}

`generate` makes a store of fictional brands over eight product types; every product's attribute set is unique
within its type, so each instruction has a product that earns the full reward. `convert_webshop` turns WebShop's
own files (`items_shuffle.json`, `items_ins_v2.json`, `items_human_ins.json`) into these two files.
"""

from __future__ import annotations

import itertools
import json
import random
import re

from envs.host.records import write_jsonl
from ragen_jax import paths

# (product_category, type name, attribute pool, option values by name, price range in dollars)
PRODUCT_TYPES = (
  ("beauty › personal care › deodorant", "deodorant",
   ("aluminum free", "sensitive skin", "long lasting", "natural ingredients", "travel size"),
   {"scent": ("citrus", "lavender", "unscented", "cedar"), "size": ("2.6 oz", "3 oz", "pack of 2")}, (5, 30)),
  ("clothing › shoes › running shoes", "running shoes",
   ("lightweight", "non slip", "breathable mesh", "wide fit", "waterproof"),
   {"color": ("black", "white", "navy", "grey"), "size": ("7", "8", "9", "10", "11")}, (30, 120)),
  ("home › kitchen › coffee mug", "coffee mug",
   ("dishwasher safe", "microwave safe", "insulated", "ceramic", "large capacity"),
   {"color": ("black", "white", "green", "red"), "size": ("12 oz", "16 oz")}, (8, 35)),
  ("electronics › audio › headphones", "headphones",
   ("wireless", "noise cancelling", "over ear", "long battery life", "foldable"),
   {"color": ("black", "white", "blue", "silver")}, (20, 200)),
  ("home › bedding › pillow", "pillow",
   ("memory foam", "hypoallergenic", "machine washable", "cooling", "firm support"),
   {"size": ("standard", "queen", "king")}, (15, 60)),
  ("grocery › snacks › protein bars", "protein bars",
   ("gluten free", "low sugar", "vegan", "high protein", "keto friendly"),
   {"flavor": ("chocolate", "peanut butter", "vanilla", "berry"), "size": ("pack of 6", "pack of 12")}, (10, 40)),
  ("pet supplies › dogs › dog leash", "dog leash",
   ("reflective", "heavy duty", "retractable", "padded handle", "waterproof"),
   {"color": ("black", "red", "blue", "orange"), "size": ("small", "medium", "large")}, (8, 40)),
  ("office › writing › gel pens", "gel pens",
   ("fine point", "quick dry", "refillable", "assorted colors", "smooth writing"),
   {"size": ("pack of 10", "pack of 24")}, (5, 25)),
)
PRICE_STEPS = [10.0 * i for i in range(1, 100)]  # WebShop's price bounds (engine/goal.py PRICE_RANGE)
_SYLLABLES = ("ka", "ve", "lor", "mi", "zan", "tor", "qu", "bel", "dra", "sen", "no", "vi", "rex", "ul", "pa", "ti")


def price_upper(price: float, rng: random.Random) -> float:
  """WebShop's goal price bound: the larger of two of the first four multiples of 10 above `price` (1e6 when
  fewer than two exist)."""
  steps = [p for p in PRICE_STEPS if p > price][:4]
  return max(rng.sample(steps, 2)) if len(steps) >= 2 else 1_000_000.0


def _listing(words: list[str]) -> str:
  return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


def instruction_text(name: str, attributes: list[str], options: list[str], upper: float) -> str:
  """A generated goal's instruction, in the shape of WebShop's ("..., and price lower than 40.00 dollars")."""
  with_options = f" in {_listing(options)}" if options else ""
  price = f", and price lower than {upper:.2f} dollars" if upper < 1_000_000 else ""
  return f"i need {_listing(attributes)} {name}{with_options}{price}"


def _attribute_sets(pool):
  return itertools.chain(itertools.combinations(pool, 2), itertools.combinations(pool, 3))


def generate(seed: int = 0, products: int = 120) -> tuple[list[dict], list[dict]]:
  """(catalog records, instruction records): `products` products spread over `PRODUCT_TYPES`, one instruction
  each, deterministic from `seed`."""
  # round robin over the types, each product a distinct set of 2 or 3 of its type's attributes
  sets_per_type = min(len(list(_attribute_sets(pool))) for _, _, pool, _, _ in PRODUCT_TYPES)
  if not 1 <= products <= sets_per_type * len(PRODUCT_TYPES):
    raise ValueError(f"the generated store holds 1 to {sets_per_type * len(PRODUCT_TYPES)} products, got {products}")
  rng = random.Random(seed)
  attribute_sets = {}
  for _, name, pool, _, _ in PRODUCT_TYPES:
    sets = list(_attribute_sets(pool))
    rng.shuffle(sets)
    attribute_sets[name] = sets
  catalog, instructions, ids = [], [], set()
  for number in range(products):
    category, name, _, option_pool, (low, high) = PRODUCT_TYPES[number % len(PRODUCT_TYPES)]
    attributes = list(attribute_sets[name].pop())
    brand = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).title()
    product_id = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
    while product_id in ids:
      product_id = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
    ids.add(product_id)
    options = {option: sorted(rng.sample(values, rng.randint(min(2, len(values)), len(values))))
               for option, values in option_pool.items()}
    price = round(rng.uniform(low, high)) - 0.01
    catalog.append({
      "id": product_id, "title": f"{brand} {' '.join(a.title() for a in attributes)} {name.title()}",
      "category": name, "product_category": category, "query": name, "attributes": attributes,
      "options": options, "price": price,
      "description": f"The {brand} {name}: {', '.join(attributes)}. Made for everyday use.",
      "features": [f"{a.capitalize()}." for a in attributes] + [f"Sold by {brand}."]})
    wanted = [rng.choice(values) for values in options.values()]
    upper = price_upper(price, rng)
    instructions.append({"id": product_id, "instruction": instruction_text(name, attributes, wanted, upper),
                         "attributes": attributes, "options": wanted, "price_upper": upper})
  return catalog, instructions


def write_generated(directory: str, seed: int = 0, products: int = 120) -> tuple[str, str]:
  """(catalog path, instructions path) of the generated store in `directory/generated-seed{seed}-products{n}/`,
  written once."""
  folder = paths.join(directory, f"generated-seed{seed}-products{products}")
  catalog_path, instructions_path = paths.join(folder, "catalog.jsonl"), paths.join(folder, "instructions.jsonl")
  if not (paths.exists(catalog_path) and paths.exists(instructions_path)):
    catalog, instructions = generate(seed, products)
    write_jsonl(catalog_path, catalog)
    write_jsonl(instructions_path, instructions)
  return catalog_path, instructions_path


def _prices(pricing) -> list[float]:
  """WebShop's price parsing: the number after each `$` of the pricing string (`"$12.99"`, `"$10.00 - $15.00"`)."""
  numbers = [re.sub(r"[^\d.]", "", part) for part in str(pricing or "").split("$")[1:]]
  return [float(number) for number in numbers if number.strip(".")]


def _values(options) -> list[str]:
  """Goal option values: WebShop's human goals hold a list, its synthetic goals a dict by option name."""
  return [str(v) for v in (options.values() if isinstance(options, dict) else options or [])]


def convert_webshop(items_path: str, attributes_path: str, human_instructions_path: str, out_dir: str,
                    seed: int = 0) -> tuple[str, str]:
  """WebShop's product file, attribute file and human instructions as (catalog path, instructions path) in
  `out_dir`, following WebShop's loader (`engine.load_products`, `goal.get_human_goals`): option values lower
  case with "/" as " | ", the lowest listed price (100 when none), attributes from the attribute file, goals from
  the human instructions with WebShop's price bound drawn from `seed`."""
  items = json.loads(paths.read_text(items_path))
  attributes = json.loads(paths.read_text(attributes_path))
  human = json.loads(paths.read_text(human_instructions_path))
  rng = random.Random(seed)
  catalog, instructions, seen = [], [], set()
  for item in items:
    asin = str(item.get("asin", ""))
    if asin in seen or asin == "nan" or not asin or len(asin) > 10:
      continue
    seen.add(asin)
    prices = _prices(item.get("pricing"))
    options = {name.lower(): [str(v["value"]).strip().replace("/", " | ").lower() for v in values]
               for name, values in (item.get("customization_options") or {}).items() if values}
    bullets = item.get("small_description") or []
    catalog.append({
      "id": asin, "title": item["name"], "category": item.get("category", ""),
      "product_category": item.get("product_category", ""), "query": str(item.get("query", "")).lower().strip(),
      "attributes": (attributes.get(asin) or {}).get("attributes") or ["DUMMY_ATTR"], "options": options,
      "price": prices[0] if prices else 100.0, "description": item.get("full_description") or "",
      "features": bullets if isinstance(bullets, list) else [bullets]})
    for goal in human.get(asin, []):
      if goal.get("instruction_attributes"):
        upper = price_upper(catalog[-1]["price"], rng)
        price_text = f", and price lower than {upper:.2f} dollars" if upper < 1_000_000 else ""
        instructions.append({"id": asin, "instruction": goal["instruction"].strip(".") + price_text,
                             "attributes": goal["instruction_attributes"],
                             "options": _values(goal.get("instruction_options")), "price_upper": upper})
  catalog_path, instructions_path = paths.join(out_dir, "catalog.jsonl"), paths.join(out_dir, "instructions.jsonl")
  write_jsonl(catalog_path, catalog)
  write_jsonl(instructions_path, instructions)
  return catalog_path, instructions_path
