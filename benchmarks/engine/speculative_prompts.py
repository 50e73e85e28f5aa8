"""Prompt sets of `benchmarks.engine.speculative`: answers that copy their input, and answers with
nothing to copy. Written for this benchmark (code edits, extraction, quoting, reformatting)."""

from __future__ import annotations

_CODE = """def load_orders(path):
    orders = []
    with open(path) as handle:
        for line in handle:
            order_id, customer, amount = line.strip().split(",")
            orders.append({"id": order_id, "customer": customer, "amount": float(amount)})
    return orders


def total_by_customer(orders):
    totals = {}
    for order in orders:
        totals[order["customer"]] = totals.get(order["customer"], 0.0) + order["amount"]
    return totals
"""

_CLASS = """class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value = self.value + step
        return self.value

    def reset(self):
        self.value = 0
"""

_LETTER = (
    "Dear Ms. Alvarez,\n\nThank you for your order of three ceramic bowls and one teapot, placed on "
    "March 4. The bowls shipped yesterday from our warehouse in Porto and should arrive within five "
    "business days. The teapot is back-ordered; we expect new stock on March 20 and will ship it then "
    "at no extra cost. If you would rather cancel the teapot, reply to this letter and we will refund "
    "it in full.\n\nKind regards,\nJoana Silva\nCustomer Care, Casa Azul Pottery"
)

_ARTICLE = (
    "The city council voted on Tuesday to extend the night bus network. Routes N4 and N7 will run "
    "every twenty minutes until 3 a.m. from June 1, and a new route, N12, will connect the harbour "
    "with the university campus. The council said the extension will cost 1.2 million euros a year, "
    "paid for by the parking levy approved last autumn. Transport director Ana Costa said ridership "
    "on the existing night routes grew by 18 percent last year."
)

_JSON = (
    '{"name": "Ada Lovelace", "born": 1815, "city": "London", "fields": ["mathematics", '
    '"computing"], "known_for": "the first published algorithm for a machine"}'
)

COPY_PROMPTS = [
    "Rename the function `load_orders` to `read_orders` in this code. Reply with the whole code only.\n\n"
    + _CODE,
    "Add a docstring to every function in this code. Reply with the whole code only.\n\n" + _CODE,
    "Rename the attribute `value` to `count` in this class. Reply with the whole class only.\n\n" + _CLASS,
    "Copy the letter below exactly, changing only the date March 20 to March 27.\n\n" + _LETTER,
    "Quote the sentence of this article that says what the extension costs, word for word, then "
    "quote the sentence about ridership.\n\n" + _ARTICLE,
    "Repeat the following article exactly as written.\n\n" + _ARTICLE,
    "Rewrite this JSON with the key `city` renamed to `birthplace`. Reply with the JSON only.\n\n" + _JSON,
    "Extract every sentence of this letter that mentions the teapot, word for word, one per line.\n\n"
    + _LETTER,
]

FRESH_PROMPTS = [
    "Write a short story about a dragon who learns to bake bread.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me five ideas for a rainy weekend with children.",
    "What are the benefits of regular exercise?",
    "Describe a walk through a forest in autumn.",
    "Write a poem about the sea at night.",
    "How do bees make honey?",
    "Suggest a name for a new coffee shop and explain why.",
]
