"""lm-evaluation-harness model ``kinterval`` (paper App. C.3, layer 3) over kinterval training checkpoints.

    kinterval lm-eval --model_args run=RUN,checkpoint=latest,operator=softmax --tasks ... --device cpu

(lm-eval's own command line with this model registered; ``--model kinterval`` is implied.) The tokenizer is
the offline GPT-2 BPE (``kinterval.data.tokenizer``); a checkpoint with another vocabulary (e.g. trained on
the synthetic corpus) is refused before scoring. The run's own operator is used unless ``operator``
substitutes another (softmax substitution). Inputs longer than the context keep their last ``block_size``
tokens; a continuation longer than the context is refused (``ValueError``, as lm-eval's HFLM). Greedy
decoding only.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import torch

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as err:  # a missing lm-eval gets the hint; a broken one keeps its cause
    missing = isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == "lm_eval"
    raise ImportError(
        "kinterval.eval.lm_eval_adapter needs lm-eval: pip install 'kinterval[eval]'"
        + ("" if missing else f" (importing it failed: {err})")
    ) from (None if missing else err)

from kinterval.data.tokenizer import EOT, GPT2_BPE_SHA256, GPT2_VOCAB, gpt2_encoding
from kinterval.eval.downstream import parse_batch_size
from kinterval.model.numerics import autocast, eval_precision
from kinterval.train.distributed import pick_device
from kinterval.train.load import load_run


@register_model("kinterval")
class KIntervalLM(TemplateLM):
    def __init__(self, run: str, checkpoint="latest", operator: str | None = None, device: str = "cpu",
                 batch_size=1, max_gen_toks: int = 256, backend: str | None = None,
                 bpe_file: str | None = None, max_batch_size=None) -> None:  # fmt: skip
        super().__init__()
        self.batch_size = parse_batch_size(batch_size)
        self._device = pick_device(device or "cpu")  # "auto": CUDA when available, as load_run
        loaded = load_run(run, checkpoint, self._device, operator, backend or "auto")
        self.model, self.state = loaded.model, loaded.state
        # what runs the operator here (None: PyTorch's SDPA); not ``backend``: lm-eval's TemplateLM reads
        # that as "causal" or "seq2seq" (how it splits a context from its continuation)
        self.operator_backend = loaded.backend
        self.enc = gpt2_encoding(bpe_file)
        check_gpt2_vocabulary(run, self.model.config.vocab_size, self.state, self.enc)
        self.max_gen_toks = int(max_gen_toks)
        self.operator = self.model.operator

    # ------------------------------------------------------------------ arguments
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """``--model_args key=value,...`` (lm-eval's parser), checked as :meth:`create_from_arg_obj`."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """Refuse unknown ``--model_args``; merge lm-eval's ``--device``/``--batch_size`` without clashing.

        A key given in ``--model_args`` wins over lm-eval's own option of the same name (lm-eval would pass
        both: "got multiple values for keyword argument"; its ``--device`` also has a default, ``cuda:0``,
        that cannot be told from a choice).
        """
        accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        unknown = sorted(set(arg_dict) - set(accepted))
        if unknown:
            raise ValueError(
                f"unknown --model_args for the kinterval model: {', '.join(unknown)} "
                f"(accepted: {', '.join(accepted)})"
            )
        args = dict(arg_dict)
        for key, value in (additional_config or {}).items():
            if value is None or key not in accepted:
                continue
            args.setdefault(key, value)
        if "run" not in args:
            raise ValueError("the kinterval model needs --model_args run=RUN (a training run folder)")
        return cls(**args)

    # ------------------------------------------------------------------ tokens
    @property
    def eot_token_id(self) -> int:
        return EOT

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    def tok_encode(self, string: str, **kwargs) -> list[int]:
        return self.enc.encode_ordinary(string)

    def tok_decode(self, tokens) -> str:
        return self.enc.decode(list(tokens))

    @torch.no_grad()
    def _logprobs(self, batch: list[list[int]]) -> torch.Tensor:
        """log-softmax (float32) of right-padded inputs; causal attention keeps padding out of real tokens."""
        n = max(map(len, batch))
        x = torch.tensor([s + [EOT] * (n - len(s)) for s in batch], device=self._device)
        numerics = self.model.config.numerics
        with eval_precision(numerics), autocast(numerics, self._device):
            logits, _ = self.model(x)
        return torch.log_softmax(logits.float(), dim=-1)

    # ------------------------------------------------------------------ requests
    def _loglikelihood_tokens(
        self, requests, disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """(sum log p(cont | ctx), cont is the greedy one) per request ((ctx, cont), ctx_enc, cont_enc)."""
        out = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            inputs, conts = [], []
            for pair, ctx, cont in chunk:
                if not cont:  # as HFLM (an assertion there): its score would be 0.0 and "greedy", silently
                    what = f"{pair[1]!r} after the context ending {pair[0][-40:]!r}" if pair else "(tokens)"
                    raise ValueError(
                        f"the continuation {what} encodes to no tokens (the GPT-2 BPE merges it into the "
                        "context's last token, or it is empty): it cannot be scored"
                    )
                if len(cont) > self.max_length:  # as lm-eval's HFLM: its scores would need a longer context
                    raise ValueError(
                        f"a continuation of {len(cont)} tokens is longer than the model's context "
                        f"({self.max_length} tokens): it cannot be scored"
                    )
                # a context that encodes to nothing (lm-eval moves a whitespace-only context's spaces into
                # the continuation) is EOT, as lm-eval makes an empty one: else the first continuation token
                # would be scored at position -1, the last one's logits
                ctx = list(ctx) or [self.prefix_token_id]
                full = (ctx + cont)[-(self.max_length + 1) :]
                inputs.append(full[:-1])
                conts.append(cont)
            logp = self._logprobs(inputs)
            for row, (inp, cont) in enumerate(zip(inputs, conts)):
                pos = torch.arange(len(inp) - len(cont), len(inp), device=self._device)
                lp = logp[row, pos]
                tgt = torch.tensor(cont, device=self._device)
                ll = lp.gather(-1, tgt[:, None]).sum().item()
                out.append((ll, bool((lp.argmax(-1) == tgt).all())))
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's tokenization and :meth:`_loglikelihood_tokens`; a non-finite score is refused."""
        out = super().loglikelihood(requests, disable_tqdm)
        for req, (ll, _) in zip(requests, out):
            check_finite(ll, req)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Total log-likelihood of each string, in disjoint windows of the model's context (as HFLM)."""
        out = []
        for req in requests:
            (string,) = req.args
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1,
            )  # fmt: skip
            reqs = [(None, ctx, cont) for ctx, cont in map(make_disjoint_window, windows)]
            out.append(sum(ll for ll, _ in self._loglikelihood_tokens(reqs)))
            check_finite(out[-1], req)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding until an ``until`` string (empty ones ignored), EOT or ``max_gen_toks`` new tokens;
        an empty context starts from EOT."""
        out = []
        for context, gen_kwargs in (req.args for req in requests):
            until = gen_kwargs.get("until") or []
            until = [u for u in ([until] if isinstance(until, str) else list(until)) if u]  # "" stops nothing
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            tokens, new = self.tok_encode(context) or [self.prefix_token_id], []  # an empty context: EOT
            for _ in range(max_new):
                nxt = int(self._logprobs([(tokens + new)[-self.max_length :]])[0, -1].argmax())
                if nxt == EOT:
                    break
                new.append(nxt)
                if any(u in self.tok_decode(new) for u in until):
                    break
            text = self.tok_decode(new)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


def check_finite(ll: float, request) -> None:
    """Refuse a NaN or infinite log-likelihood (a checkpoint whose forward overflows): lm-eval would score
    it silently (the argmax of all-NaN choices is choice 0). The request is named by its lm-eval task and
    doc_id, else by the first characters of its context."""
    if math.isfinite(ll):
        return
    task, doc = getattr(request, "task_name", None), getattr(request, "doc_id", None)
    if task is not None:
        where = f"task {task!r}, doc_id {doc}"
    else:
        where = f"the request with context {str(request.args[0])[:40]!r}"
    raise ValueError(f"{where}: the log-likelihood is {ll} (not finite): the checkpoint's forward gives NaN "
                     "or inf, its scores would be meaningless")  # fmt: skip


def check_gpt2_vocabulary(run, vocab_size: int, state: dict, enc) -> None:
    """Refuse a checkpoint that the GPT-2 BPE cannot feed: its vocabulary, and its data's tokenizer."""
    if vocab_size != GPT2_VOCAB:
        raise ValueError(
            f"{run}: the checkpoint has a vocabulary of {vocab_size} ids, lm-eval tasks are tokenized "
            f"with the GPT-2 BPE ({GPT2_VOCAB} ids); only runs trained on GPT-2-tokenized data can be scored"
        )
    if enc.n_vocab != GPT2_VOCAB or enc.eot_token != EOT:
        raise ValueError(f"the tokenizer has {enc.n_vocab} ids and EOT {enc.eot_token}: not the GPT-2 BPE")
    data_dir = ((state.get("config") or {}).get("data") or {}).get("dir")
    meta_path = Path(data_dir) / "meta.json" if data_dir else None
    if meta_path is not None and meta_path.is_file():  # the training data's tokenizer, when it is at hand
        try:
            tokenizer = json.loads(meta_path.read_text()).get("tokenizer") or {}
        except (json.JSONDecodeError, AttributeError):
            return  # the data folder's own loader names a malformed meta.json
        if tokenizer.get("name") != "gpt2" or tokenizer.get("sha256") not in (None, GPT2_BPE_SHA256):
            raise ValueError(
                f"{run}: trained on data tokenized with {tokenizer.get('name')!r} ({meta_path}), "
                "not the GPT-2 BPE that lm-eval tasks are tokenized with"
            )
