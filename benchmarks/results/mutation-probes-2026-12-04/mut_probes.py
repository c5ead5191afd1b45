# ruff: noqa: E501  (the mutant table: one exact source string per field)
"""One-string mutation audit of the synthetic probes (generation, scoring, summaries, paired deltas, slopes,
reading summary.json / samples.jsonl), the report's probe comparisons, n-gram overlap, bin import, the shard
writer and the transformers GPT-2 export.

Each mutant replaces one exact substring of one source file (it must occur exactly once), runs the targeted
test files with ``-x -q`` and records killed (a test failed), survived, or timeout (``$MUT_TIMEOUT`` seconds,
90 by default; counted as killed); the file is restored byte for byte, also on an exception or a timeout.
Run from the repository root (or a copy of it) with its ``src`` first on PYTHONPATH:

    PYTHONPATH=src python benchmarks/results/mutation-probes-2026-12-04/mut_probes.py [NAME ...]

Results are appended as JSON lines to ``mutants.jsonl`` beside this script (``$MUT_OUT``: another name, or
a path); mutants already there are skipped. ``$MUT_FILES``: comma-separated substrings; only mutants of a
file containing one run (two copies of the tree can split the table). Touch ``STOP`` beside the script to
stop between mutants.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
OUT = Path(__file__).parent / os.environ.get("MUT_OUT", "mutants.jsonl")
STOP = Path(__file__).with_name("STOP")
FILES = [s for s in os.environ.get("MUT_FILES", "").split(",") if s]
TIMEOUT = float(os.environ.get("MUT_TIMEOUT", "90"))

PR, RP = "src/kinterval/eval/probes.py", "src/kinterval/report/probes.py"
OV, IB, WR = (
    "src/kinterval/data/overlap.py",
    "src/kinterval/data/import_bin.py",
    "src/kinterval/data/writer.py",
)
HF = "src/kinterval/integrations/hf_export.py"

T_PR = ["tests/eval/test_probes.py"]
T_RP = ["tests/report/test_report_probes.py"]
T_OV = ["tests/data/test_data_overlap.py"]
T_IB = ["tests/data/test_data_errors.py", "tests/data/test_data_prepare.py"]
T_WR = T_IB + ["tests/test_io_failures.py"]
T_HF = ["tests/integrations/test_hf_export.py"]

# fmt: off
MUTANTS = [
    # ------------------------------------------------------------ eval/probes.py
    ("pr-A-fits-strict", PR, "fits = [d for d in distances if PREFIX + d + 1 <= block]", "fits = [d for d in distances if PREFIX + d + 1 < block]", T_PR),
    ("pr-A-control-one-token", PR, "control[PREFIX : PREFIX + 2] = stream[-2:]", "control[PREFIX : PREFIX + 1] = stream[-1:]", T_PR),
    ("pr-B-fits-strict", PR, "fits = [n for n in n_pairs if 2 * n + 1 <= block]", "fits = [n for n in n_pairs if 2 * n + 1 < block]", T_PR),
    ("pr-B-near-far-swapped", PR, '(("near", n - q, n), ("far", 0, q))', '(("near", 0, q), ("far", n - q, n))', T_PR),
    ("pr-B-q-min-0", PR, "q = max(1, n // 4)", "q = max(1, n // 2)", T_PR),
    ("pr-C-fits-strict", PR, "if PREFIX + 2 * L + 1 <= block]", "if PREFIX + 2 * L + 1 < block]", T_PR),
    ("pr-C-start-late", PR, "start = PREFIX + L  #", "start = PREFIX + L + 1  #", T_PR),
    ("pr-all-C-families", PR, "c, skip_c = copy_samples(copies, vocab, block, seed=seed)", "c, skip_c = copy_samples(n_families, vocab, block, seed=seed)", T_PR),
    ("pr-draw-eot-allowed", PR, "bad = np.array(sorted(set(exclude) | {EOT}))", "bad = np.array(sorted(set(exclude) | {-1}))", T_PR),
    ("pr-smallest-A-off", PR, 'need = [f"A >= {PREFIX + d + 1} (distance {d})"]', 'need = [f"A >= {PREFIX + d} (distance {d})"]', T_PR),
    ("pr-score-target-same", PR, "tgt = seqs[row, pos + 1]", "tgt = seqs[row, pos]", T_PR),
    ("pr-summ-gain-sign", PR, 'pairs = [(f, d, nll[(f, d, "control")] - v)', 'pairs = [(f, d, v - nll[(f, d, "control")])', T_PR),
    ("pr-summ-B-pooled-by-family", PR, 'ids = range(len(rs)) if cond == "all" else', 'ids = [r["family"] for r in rs] if cond == "all" else', T_PR),
    ("pr-summ-no-gain-pooled", PR, "    if pairs:\n        out.append(", "    if not pairs:\n        out.append(", T_PR),
    ("pr-in-probeab-no-gain", PR, '("A", "induction"), ("A", "control-induction"), ("B", "all")}', '("A", "induction"), ("B", "all")}', T_PR),
    ("pr-interval-signed-4f", PR, 'return f"[{num(lo)}, {num(hi)}]" if signed else', 'return f"[{lo:.4f}, {hi:.4f}]" if signed else', T_PR),
    ("pr-probe-tables-no-table-ok", PR, 'if not isinstance(summary.get("table"), list):', "if False:", T_PR),
    ("pr-field-bool-family", PR, "is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)", "is_int = lambda x: isinstance(x, int)", T_PR),
    ("pr-field-nonfinite", PR, "finite = lambda x: (is_int(x) or isinstance(x, float)) and math.isfinite(x)", "finite = lambda x: is_int(x) or isinstance(x, float)", T_PR),
    ("pr-summary-operator-unchecked", PR, 'if not isinstance(summary, dict) or not isinstance(summary.get("operator"), str):', "if not isinstance(summary, dict):", T_PR),
    ("pr-samples-sha-unchecked", PR, "if want is not None and atomic.sha256_bytes(data) != want:", "if False:", T_PR),
    ("pr-samples-fields-unchecked", PR, "if not isinstance(row, dict) or any(f not in row for f in SAMPLE_FIELDS):", "if not isinstance(row, dict):", T_PR),
    ("pr-samples-empty-ok", PR, "    if not rows:\n        raise ValueError(f\"{path} holds no samples", "    if False:\n        raise ValueError(f\"{path} holds no samples", T_PR),
    ("pr-ci-units-families", PR, 'units = len(np.unique(families)) if probe == "A" else len(values)', "units = len(np.unique(families))", T_PR),
    ("pr-ci-constant-unhandled", PR, "if not np.any(values != values[0]):", "if False:", T_PR),
    ("pr-ci-B-by-family", PR, 'if probe == "A":\n        ci = family_bootstrap_ci', 'if probe != "C":\n        ci = family_bootstrap_ci', T_PR),
    ("pr-sample-table-unchecked", PR, "        if a != b:\n            raise ValueError(f\"probe {probe}: the samples", "        if False:\n            raise ValueError(f\"probe {probe}: the samples", T_PR),
    ("pr-delta-sign", PR, '"delta": float((value - ref).mean())', '"delta": float((ref - value).mean())', T_PR),
    ("pr-deltas-ref-value-swapped", PR, '"reference": float(ref.mean()), "value": float(value.mean()),', '"reference": float(value.mean()), "value": float(ref.mean()),', T_PR),
    ("pr-order-pooled-last", PR, 'r["param"] != "all", str(r["param"]).zfill(6))', 'r["param"] == "all", str(r["param"]).zfill(6))', T_PR),
    ("pr-slope-one-family", PR, "if len(params) < 2 or len(fams) < 2:", "if len(params) < 2:", T_PR),
    ("pr-slope-gain-sign", PR, 'series[("A", "gain", "control-induction")][(fam, d)] = g - ref_gains[(fam, d)]', 'series[("A", "gain", "control-induction")][(fam, d)] = ref_gains[(fam, d)] - g', T_PR),
    ("pr-slope-nfamilies", PR, "n_families=len(fams)))", "n_families=len(params)))", T_PR),
    ("pr-compare-nresamples-bool", PR, "if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:", "if not isinstance(n_resamples, int) or n_resamples < 1:", T_PR),
    ("pr-compare-batch-unchecked", PR, '"samples_sha256", "batch_size"):', '"samples_sha256"):', T_PR),
    ("pr-compare-batch-default-1", PR, "a, b = a or 8, b or 8", "a, b = a or 1, b or 1", T_PR),
    ("pr-compare-old-sha-generic", PR, 'if field_ in ("vocab_size", "samples_sha256") and None in (a, b):', 'if field_ in ("vocab_size",) and None in (a, b):', T_PR),
    ("pr-compare-warn-two-old", PR, "if len(unknown) == 1:", "if len(unknown) >= 0:", T_PR),
    ("pr-compare-refop-wrong", PR, '"reference_operator": summaries["reference"]["operator"],', '"reference_operator": summaries["results"]["operator"],', T_PR),
    ("pr-run-seed-negative", PR, '("seed", seed, 0),', '("seed", seed, -1),', T_PR),
    ("pr-run-old-summary-kept", PR, '(out / "summary.json").unlink(missing_ok=True)', "pass", T_PR),
    ("pr-run-native-key", PR, '"native_operator": state["config"]["operator"]["name"]', '"native": state["config"]["operator"]["name"]', T_PR),
    ("pr-run-jsonl-sha-of-nothing", PR, '"samples_jsonl_sha256": atomic.sha256_bytes(data)', '"samples_jsonl_sha256": atomic.sha256_bytes(b"")', T_PR),
    # ------------------------------------------------------------ report/probes.py
    ("rp-blank-lines-are-samples", RP, "if any(line.strip() for line in f):", "if any(f):", T_RP),
    ("rp-block-not-int", RP, 'if isinstance(block, int) else "no probe fit the model"', 'if block is not False else "no probe fit the model"', T_RP),
    ("rp-compare-swapped", RP, "res = compare_probes(mine, ref)", "res = compare_probes(ref, mine)", T_RP),
    ("rp-ref-no-samples-unchecked", RP, "    if why := no_samples(ref):", "    if why := None:", T_RP),
    ("rp-name-never-suite", RP, 'name = lambda suite, rid: rid if len(suites_of[rid]) == 1 else f"{suite}/{rid}"', "name = lambda suite, rid: rid", T_RP),
    ("rp-not-evaluated-lost", RP, 'why = "no same-seed softmax control" if rid in evaluated[suite] else "not evaluated"', 'why = "no same-seed softmax control"', T_RP),
    ("rp-unpaired-no-probes-lost", RP, 'not_run=why if (mine / "summary.json").is_file() else NO_PROBES', "not_run=why", T_RP),
    ("rp-reference-run-key", RP, '"reference_run": ref_run}', '"reference_run": ref_name}', T_RP),
    # ------------------------------------------------------------ data/overlap.py
    ("ov-n-zero", OV, "    if n < 1:\n        raise ValueError(f\"n must be", "    if n < 0:\n        raise ValueError(f\"n must be", T_OV),
    ("ov-m-zero", OV, "if m <= 0:", "if m < 0:", T_OV),
    ("ov-window-eot-last-ok", OV, "return h, ends[n : n + m] == ends[:m]", "return h, ends[n - 1 : n - 1 + m] == ends[:m]", T_OV),
    ("ov-block-targets-from-0", OV, "self.token_covered[1 : k * T + 1]", "self.token_covered[: k * T]", T_OV),
    ("ov-token-share-with-eot", OV, "return self.covered / self.tokens if self.tokens else 0.0", "return self.covered / self.token_covered.size if self.tokens else 0.0", T_OV),
    ("ov-over-half-ge", OV, "(self.doc_coverage > 0.5).sum()", "(self.doc_coverage >= 0.5).sum()", T_OV),
    ("ov-touched-all", OV, '"documents_touched": int((self.doc_coverage > 0).sum())', '"documents_touched": int(self.doc_coverage.size)', T_OV),
    ("ov-chunk-step-gap", OV, "chunk - n + 1):", "chunk - n + 2):", T_OV),
    ("ov-last-window-missed", OV, "range(0, max(len(against) - n + 1, 0),", "range(0, max(len(against) - n, 0),", T_OV),
    ("ov-cover-short", OV, "np.add.at(depth, starts + n, -1)", "np.add.at(depth, starts + n - 1, -1)", T_OV),
    ("ov-chunk-lt-n-ok", OV, "if chunk < n:", "if chunk < 1:", T_OV),
    ("ov-empty-docs-kept", OV, "keep = size > 0", "keep = size >= 0", T_OV),
    ("ov-tokenizer-sha-unchecked", OV, 'other.vocab_size, other.eot, theirs.get("name"), theirs.get("sha256"),', 'other.vocab_size, other.eot, theirs.get("name"), mine.get("sha256"),', T_OV),
    ("ov-shards-sha-empty", OV, 'o.shards_sha256 = tuple(s.get("sha256") for s in checked.meta["splits"][checked.split]["shards"])', "o.shards_sha256 = ()", T_OV),
    ("ov-against-own-split", OV, "other = TokenShards(against_data if against_data is not None else data, against)", "other = TokenShards(against_data if against_data is not None else data, split)", T_OV),
    # ------------------------------------------------------------ data/import_bin.py, data/writer.py
    ("ib-tokens-zero", IB, "or tokens < 1):", "or tokens < 0):", T_IB),
    ("ib-tokens-reference-ok", IB, "if tokens is not None and not copy:", "if False:", T_IB),
    ("ib-eot-equals-vocab", IB, "if not 0 <= eot < vocab_size <= 1 << 16:", "if not 0 <= eot <= vocab_size <= 1 << 16:", T_IB),
    ("ib-odd-size-ok", IB, "if path.stat().st_size % DTYPE.itemsize:", "if False:", T_IB),
    ("ib-wider-zeros", IB, "if len(head) >= 16 and not head[1::2].any() and head[0::2].any():", "if len(head) >= 16 and not head[1::2].any():", T_IB),
    ("ib-wider-always-int64", IB, "not head[1::4].any() and not head[2::4].any() and not head[3::4].any()", "not head[1::4].any() and not head[3::4].any()", T_IB),
    ("ib-own-folder-copy-ok", IB, "if copy and path.resolve().parent == out.resolve():", "if False:", T_IB),
    ("ib-scan-max-gt", IB, "if int(chunk.max()) >= vocab_size:", "if int(chunk.max()) > vocab_size:", T_IB),
    ("ib-ndocs-wrong", IB, "n_docs += int(np.count_nonzero(chunk == eot))", "n_docs += int(np.count_nonzero(chunk >= eot - 1))", T_IB),
    ("ib-limit-per-file", IB, "ids, limit = ids[:limit], limit - len(ids[:limit])", "ids, limit = ids[:limit], limit", T_IB),
    ("ib-natural-order", IB, "key=lambda p: sources.natural_key(p.name),", "key=lambda p: p.name,", T_IB),
    ("ib-aliases-lost", IB, "names = [split] + [a for a, s in sources.SPLIT_ALIASES.items() if s == split]", "names = [split]", T_IB),
    ("wr-vocab-65537", WR, "if vocab_size > 1 << 16:", "if vocab_size > 1 << 17:", T_WR),
    ("wr-shard-unbounded", WR, "take = min(ids.size, self.shard_tokens - self._count)", "take = min(ids.size, 2 * self.shard_tokens - self._count)", T_WR),
    ("wr-negative-ids", WR, "if ids.size and (int(ids.max()) >= self.vocab_size or int(ids.min()) < 0):", "if ids.size and (int(ids.max()) >= self.vocab_size):", T_WR),
    ("wr-bytes-count", WR, '"bytes": self._count * DTYPE.itemsize', '"bytes": self._count', T_WR),
    ("wr-old-splits-kept", WR, "names |= (", "names &= (", T_WR),
    ("wr-meta-kept", WR, '(out / "meta.json").unlink(missing_ok=True)', "pass", T_WR),
    ("wr-tmp-kept", WR, "            self._tmp.unlink(missing_ok=True)\n", "            pass\n", T_WR),
    # ------------------------------------------------------------ integrations/hf_export.py
    ("hf-dtype-unchecked", HF, 'cfg.numerics.attention_dtype != "float32"', 'cfg.numerics.attention_dtype == "never"', T_HF),
    ("hf-options-unchecked", HF, "if options := cfg.attention_options:", "if options := None:", T_HF),
    ("hf-impl-sdpa-lost", HF, 'impl = "sdpa" if model.operator == "sdpa" else hf.PREFIX', "impl = hf.PREFIX", T_HF),
    ("hf-ln-eps", HF, "layer_norm_epsilon=1e-5", "layer_norm_epsilon=1e-6", T_HF),
    ("hf-no-bos", HF, "config.bos_token_id = config.eos_token_id = EOT", "config.eos_token_id = EOT", T_HF),
    ("hf-old-tokenizer-kept", HF, "        (out / name).unlink(missing_ok=True)", "        pass", T_HF),
    ("hf-readme-step", HF, 'step=state.get("step"),', 'step=None,', T_HF),
    ("hf-is-export-any-arch", HF, 'and config.get("architectures") == ["GPT2LMHeadModel"]', "and True", T_HF),
    ("hf-reexport-refused", HF, "if path.is_dir() and any(path.iterdir()) and not _is_export(path):", "if path.is_dir() and any(path.iterdir()):", T_HF),
    ("hf-file-out-ok", HF, "if path.exists() and not path.is_dir():", "if False:", T_HF),
    ("hf-linear-bias-ones", HF, "weight.new_zeros(weight.shape[0])", "weight.new_ones(weight.shape[0])", T_HF),
    ("hf-ln-bias-ones", HF, 'torch.zeros_like(sd[f"{name}.weight"])', 'torch.ones_like(sd[f"{name}.weight"])', T_HF),
    ("hf-wte-uncut", HF, 'sd["transformer.wte.weight"][: cfg.vocab_size]', 'sd["transformer.wte.weight"]', T_HF),
    ("hf-conv1d-untransposed", HF, "weight.t().contiguous()", "weight.contiguous()", T_HF),
    # ------------------------------------------------------------ round 2: the fixed probe C line (its round-1
    # mutant pr-C-fits-strict ran on the code before the fix, "PREFIX + 2 * L + 1 <= block")
    ("pr2-C-fits-strict", PR, "if PREFIX + 2 * L <= block]", "if PREFIX + 2 * L < block]", T_PR),
    ("pr2-C-fits-old", PR, "if PREFIX + 2 * L <= block]", "if PREFIX + 2 * L + 1 <= block]", T_PR),
    ("pr2-smallest-C-old", PR, 'f"C >= {PREFIX + 2 * L} (length {L})"', 'f"C >= {PREFIX + 2 * L + 1} (length {L})"', T_PR),
]
# fmt: on


def run(name, path, old, new, tests) -> dict:
    f = ROOT / path
    orig = f.read_bytes()
    text = orig.decode()
    n = text.count(old)
    if n != 1:
        return dict(name=name, file=path, status=f"bad: {n} matches")
    t0 = time.time()
    try:
        f.write_text(text.replace(old, new, 1))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return dict(
                name=name, file=path, status="timeout", by=[], rc=None, secs=round(time.time() - t0, 1)
            )
        killed = r.returncode != 0
        failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        return dict(name=name, file=path, status="killed" if killed else "survived", by=failed[:1],
                    rc=r.returncode, secs=round(time.time() - t0, 1))  # fmt: skip
    finally:
        f.write_bytes(orig)


def main(names: list[str]) -> None:
    done = set()
    if OUT.exists():
        done = {json.loads(x)["name"] for x in OUT.read_text().splitlines() if x.strip()}
    for m in MUTANTS:
        if (names and m[0] not in names) or m[0] in done or (FILES and not any(s in m[1] for s in FILES)):
            continue
        if STOP.exists():
            break
        res = run(*m)
        print(json.dumps(res), flush=True)
        with OUT.open("a") as fh:
            fh.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
