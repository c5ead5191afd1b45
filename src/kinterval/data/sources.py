"""Where documents come from: WikiText-103, FineWebEdu, PTB and C4 (Hugging Face ``datasets``) and local
text files.

Split rules (all deterministic, documented in docs/data.md):

* WikiText-103 keeps its own train/validation/test splits. HF rows are single lines (blank lines are ``""``);
  an article starts at a level-1 heading row `` = Title = `` and runs to the next one.
* FineWebEdu ``sample-10BT`` has only ``train``; a document goes to ``val`` when
  ``int(md5(id), 16) % 1000 == 0`` (0.1 %), everything else to ``train``.
* PTB and C4 are held-out corpora (paper App. C.3, layer 1): the PTB test split, its sentences one a line as
  one document, all in ``test``; the first N documents of the C4 ``en`` validation stream, all in ``val``.
* Any Hugging Face dataset (``hf:PATH``): one split streamed, a row's text field one document; a document
  goes to val/test/train by the local-text rule below with key = the row's ``id`` (its stream index when
  there is no ``id`` column), or all into one named split.
* Local text: one document per file for a folder (``*.txt``/``*.md``/``*.rst`` recursively, or every
  non-hidden file when there are none of those); a single file is split into paragraphs at blank lines
  (``"\\n\\n"``, as ``datasets``' ``sample_by="paragraph"``). The split of a document follows
  ``int(md5(key), 16) % 100``: 0-1 val, 2-3 test, the rest train, with key = the path relative to the folder
  (or ``name#i`` for the i-th paragraph of a single file); within a split documents are ordered by that md5.
  With one split named, every document goes to it instead, in natural file order (paragraphs in file order).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

SPLITS = ("train", "val", "test")
SPLIT_ALIASES = {"validation": "val", "valid": "val"}
TEXT_SUFFIXES = {".txt", ".md", ".rst"}
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def natural_key(name: str) -> list:
    """Sort key comparing digit runs as integers: ``train_2.bin`` before ``train_10.bin``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def md5_int(key: str) -> int:
    """md5 of the key's UTF-8 bytes; a file name that is not UTF-8 (Python keeps its bytes as surrogates)
    hashes its own bytes."""
    return int(hashlib.md5(key.encode("utf-8", "surrogateescape")).hexdigest(), 16)


def md5_split(key: str) -> str:
    """0-1 val, 2-3 test, 4-99 train (the rule of the pre-tokenized docs corpus)."""
    bucket = md5_int(key) % 100
    return "val" if bucket < 2 else "test" if bucket < 4 else "train"


# ---- WikiText-103 ---------------------------------------------------------------------------------------


def wikitext_articles(rows: Iterable[str]) -> Iterator[str]:
    """Group WikiText line rows into articles; blank rows stay blank lines, text before a title is kept."""
    current: list[str] = []
    for row in rows:
        line = row.rstrip("\n")
        if _WIKITEXT_TITLE.match(line) and any(s.strip() for s in current):
            yield "\n".join(current).strip("\n") + "\n"
            current = []
        current.append(line)
    if any(s.strip() for s in current):
        yield "\n".join(current).strip("\n") + "\n"


def load_wikitext103():
    """HF DatasetDict with train/validation/test rows of ``{"text": line}`` (downloads once, then cached)."""
    return _from_hub("Salesforce/wikitext", "wikitext-103-raw-v1")


# ---- FineWebEdu -----------------------------------------------------------------------------------------


def fineweb_split(doc_id: str) -> str:
    return "val" if md5_int(doc_id) % 1000 == 0 else "train"


def stream_fineweb_edu():
    """Streaming ``{"id", "text", ...}`` rows of FineWebEdu sample-10BT (network, no full download)."""
    return _from_hub("HuggingFaceFW/fineweb-edu", "sample-10BT", split="train", streaming=True)


# ---- any Hugging Face dataset ---------------------------------------------------------------------------


# a local data file's format: datasets' packaged builder
HF_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text",
                    ".arrow": "arrow"}  # fmt: skip


def stream_hf(path: str, config: str | None = None, split: str = "train"):
    """Streaming rows of ``split`` of ``path``: a Hub dataset id, or a local dataset folder or data file that
    ``datasets.load_dataset`` reads (json/jsonl, parquet, csv, arrow, txt), or a folder written by
    ``save_to_disk`` (read with ``load_from_disk``). A local one is read offline."""
    local = Path(path).exists()
    if not local and (
        path.startswith(("/", ".", "~"))
        or path.count("/") > 1
        or "\\" in path
        or Path(path).suffix.lower() in HF_FILE_BUILDERS
    ):  # not a Hub id (NAME or OWNER/NAME) either: a local path with a typo, not a download to wait for
        raise FileNotFoundError(f"hf:{path}: no such file or folder")
    try:  # a local path is read by datasets too (offline)
        import datasets  # noqa: F401
    except ImportError:
        raise ValueError(f"hf:{path} needs the datasets package: pip install 'kinterval[data]'") from None
    args, kw = (path, config), {"split": split, "streaming": True}
    saved = local and saved_to_disk(Path(path))
    if local and Path(path).is_dir() and not saved:
        _one_format(Path(path))
    if local and Path(path).is_file():  # a single data file: its format's packaged builder
        suffix = Path(path).suffix.lower()  # d.JSONL as d.jsonl
        if suffix not in HF_FILE_BUILDERS:
            raise ValueError(f"hf:{path}: a data file must end in one of {', '.join(HF_FILE_BUILDERS)}")
        if config is not None:  # the packaged builder would take any name, and it would change nothing
            raise ValueError(f"hf:{path}: --hf-config names a dataset's configuration; a data file has none")
        args = (HF_FILE_BUILDERS[suffix], None)
        kw["data_files"] = {split: glob.escape(str(path))}  # datasets globs it: d[1].jsonl is that file
    try:
        with datasets_offline() if local else contextlib.nullcontext():
            rows = _from_disk(path, config, split) if saved else _from_hub(*args, **kw)
    except (ValueError, OSError) as err:  # "Bad split: ...", "BuilderConfig ... not found", a damaged file
        if isinstance(err, FileNotFoundError):  # datasets' "doesn't contain any data files": as it is
            raise
        where = "" if local else " (no local file or folder of that name: read as a Hub id)"
        raise ValueError(f"hf:{path}{where}: {' '.join(str(err).split())}") from err
    except StopIteration:  # datasets' json builder on an empty file
        raise ValueError(f"{path}: split {split!r} holds no row") from None
    return _read_on(path, rows)


def saved_to_disk(folder: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (``load_dataset`` refuses
    it; ``load_from_disk`` reads it)."""
    return (folder / "dataset_dict.json").is_file() or (
        (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file()
    )


def _from_disk(path: str, config: str | None, split: str):
    """The rows of a ``save_to_disk`` folder: a DatasetDict's ``split``; a Dataset whole (it is one split:
    ``split`` must be the default ``train`` or the split it was saved from)."""
    import datasets

    if config is not None:
        raise ValueError("--hf-config names a dataset's configuration; a save_to_disk folder has none")
    dataset = datasets.load_from_disk(path)
    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise ValueError(f"no split {split!r}; its splits: {sorted(dataset)} (choose with --hf-split)")
        dataset = dataset[split]
    elif split != "train" and str(dataset.split) != split:
        raise ValueError(
            f"a saved Dataset is one split ({dataset.split or 'unnamed'}), not {split!r}: omit --hf-split"
        )
    if len(dataset) == 0:
        raise ValueError(f"split {split!r} holds no row")
    return iter(dataset)


def _read_on(path: str, rows):
    """``rows``, with a row that cannot be read (a malformed line deep in a data file, a truncated file, a
    dropped connection: pyarrow's and datasets' ValueError or OSError) one line naming the row."""
    rows = iter(rows)
    for i in itertools.count():
        try:
            row = next(rows)
        except StopIteration:
            return
        except (ValueError, OSError) as err:
            raise ValueError(
                f"hf:{path}: row {i} or a later one cannot be read: {' '.join(str(err).split())}"
            ) from err
        yield row


def _one_format(folder: Path) -> None:
    """Refuse a local dataset folder whose data files have several formats (say a ``.jsonl`` and ``.txt``
    notes): ``datasets`` would read only the most common format's files and silently drop the others.
    A README.md with ``configs:`` names its data files itself and is left to ``datasets``."""
    readme = folder / "README.md"
    if readme.is_file() and "configs:" in readme.read_text(encoding="utf-8", errors="replace"):
        return
    formats: dict[str, list[str]] = {}
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder)
        if f.is_file() and not any(p.startswith((".", "__")) for p in rel.parts):
            builder = HF_FILE_BUILDERS.get(f.suffix.lower())
            if builder is not None:
                formats.setdefault(builder, []).append(rel.as_posix())
    if len(formats) > 1:
        found = "; ".join(f"{b}: {', '.join(f[:3])}{' ...' * (len(f) > 3)}" for b, f in formats.items())
        raise ValueError(
            f"hf:{folder}: data files of several formats ({found}); datasets would read the most common "
            "format only and ignore the rest: give one data file, or a folder of one format"
        )


def hf_router(text_field: str, split: str | None):
    """``route(i, row) -> (split, text)`` of the ``hf:`` source: the row's ``text_field`` (None, empty or
    whitespace-only text: skipped), into ``split`` or by :func:`md5_split` of the row's ``id`` column (its
    index in the stream when it has none)."""

    def route(i: int, row: dict):
        if text_field not in row:
            raise ValueError(
                f"the dataset has no text field {text_field!r}; its fields: {sorted(row)} (choose one with "
                "--text-field)"
            )
        text = row[text_field]
        if text is not None and not isinstance(text, str):
            raise ValueError(f"field {text_field!r} of row {i} is {type(text).__name__}, not text")
        if text:  # a .txt file's leading byte-order mark reaches its first row (json/csv readers drop it)
            text = text.removeprefix("\ufeff")
        text = text if text and text.strip() else None
        key = row.get("id")  # a null id is no key: the stream index, as without an id column
        if isinstance(key, float) and key.is_integer():  # a csv id column with a blank cell reads as floats:
            key = int(key)  # 1.0 keys as 1, so that one blank id moves no other document to another split
        return (split or md5_split(str(i if key is None else key))), text

    return route


# ---- held-out corpora (paper App. C.3, layer 1) --------------------------------------------------------

PTB_HUB = ("ptb-text-only/ptb_text_only", "penn_treebank")  # the former canonical "ptb_text_only"
C4_HUB = ("allenai/c4", "en")
C4_DOCUMENTS = 302  # the paper's count; it does not say which 302, we take the first of the stream


def ptb_test_document() -> str:
    """The PTB test split (3,761 ``{"sentence"}`` rows, stripped lines of ptb.test.txt) as one document, a
    sentence a line, in order."""
    rows = _from_hub(*PTB_HUB, split="test")
    return "".join(f"{sentence}\n" for sentence in rows["sentence"])


def c4_validation_documents(n: int = C4_DOCUMENTS) -> list[str]:
    """The ``text`` of the first ``n`` documents of the C4 ``en`` validation split, in stream order (streamed:
    only these are downloaded)."""
    rows = _from_hub(*C4_HUB, split="validation", streaming=True)
    texts = [row["text"] for row in itertools.islice(rows, n)]
    if len(texts) < n:
        raise ValueError(f"the C4 validation stream ended after {len(texts)} documents; {n} were asked for")
    return texts


def _from_hub(path: str, name: str | None, **kw):
    """``datasets.load_dataset(path, name, **kw)``; a Hub that cannot be reached is one clear error.

    A stream (``streaming=True``) is returned as an iterator whose first row has been read already: opening
    a stream does not download, and an unreachable Hub must fail before ``prepare`` clears its output.
    """
    try:
        import datasets
    except ImportError:
        raise ValueError(
            "the Hugging Face sources need the datasets package: pip install 'kinterval[data]'"
        ) from None
    try:
        dataset = datasets.load_dataset(path, name, **kw)
        if kw.get("streaming"):
            rows = iter(dataset)
            dataset = itertools.chain(list(itertools.islice(rows, 1)), rows)
        return dataset
    except ConnectionError as err:
        raise ValueError(
            f"could not download {path}{f' ({name})' if name else ''} from the Hugging Face Hub: {err}. "
            "Check the network (or HF_HUB_OFFLINE), or prepare from local files: --source text:PATH, "
            "hf:LOCAL_PATH or bin:DIR"
        ) from err
    except RuntimeError as err:  # datasets >= 4 refuses a Hub copy that still needs its loading script
        if "script" not in str(err):
            raise
        raise ValueError(
            f"datasets {datasets.__version__} cannot load {path}{f' ({name})' if name else ''}: {err}. "
            "Prepare from local files instead: --source text:PATH --split SPLIT"
        ) from err


# ---- local text -----------------------------------------------------------------------------------------


def list_text_files(root: Path, exclude: Path | None = None) -> list[Path]:
    """The document files of ``root``; none under ``exclude`` (the output folder, when it lies inside
    ``root``: a second prepare must not read the dataset the first one wrote there)."""
    if not root.exists():
        raise FileNotFoundError(f"text source not found: {root}")
    if root.is_file():
        return [root]
    skip = exclude.resolve() if exclude is not None else None
    visible = [p for p in root.rglob("*") if not any(s.startswith(".") for s in p.relative_to(root).parts)]
    if broken := [p for p in visible if p.is_symlink() and not p.exists()]:  # a document lost in silence
        raise FileNotFoundError(f"{broken[0]}: a link to a file that does not exist ({len(broken)} such)")
    files = sorted(
        (p for p in visible if p.is_file() and not (skip is not None and p.resolve().is_relative_to(skip))),
        key=lambda p: natural_key(p.relative_to(root).as_posix()),
    )
    texts = [p for p in files if p.suffix.lower() in TEXT_SUFFIXES]
    if not (texts or files):
        raise ValueError(f"no text files under {root}")
    return texts or files


def _read_plain(files: list[Path], paragraphs: bool) -> list[str]:
    out = []
    for f in files:
        try:
            # universal newlines, like datasets' text builder; a leading byte-order mark is no text
            text = f.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise ValueError(f"{f}: not UTF-8 text ({err})") from None
        out += [p for p in text.split("\n\n") if p] if paragraphs else [text]
    return out


@contextlib.contextmanager
def datasets_offline():
    """``datasets`` in offline mode for the duration: a local load then never touches the network.

    ``datasets`` reads ``HF_DATASETS_OFFLINE``/``HF_HUB_OFFLINE`` once, at import, into ``datasets.config``
    (and would otherwise count the "download" of the packaged ``text`` builder with a HEAD request), so
    both the environment and the config are set, and restored afterwards.
    """
    import datasets

    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_UPDATE_DOWNLOAD_COUNTS": "0"}
    config = {"HF_DATASETS_OFFLINE": True, "HF_HUB_OFFLINE": True, "HF_UPDATE_DOWNLOAD_COUNTS": False}
    old_env = {k: os.environ.get(k) for k in env}
    old_config = {k: getattr(datasets.config, k) for k in config if hasattr(datasets.config, k)}
    os.environ.update(env)
    for k in old_config:
        setattr(datasets.config, k, config[k])
    try:
        yield
    finally:
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in old_config.items():
            setattr(datasets.config, k, v)


def _read_datasets(files: list[Path], paragraphs: bool) -> list[str]:
    import datasets

    mode = "paragraph" if paragraphs else "document"
    bars_were_off = datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()  # local files load in a blink; keep the output clean
    # a private cache (nothing stale, nothing left behind), and offline: a local source never uses the network
    with tempfile.TemporaryDirectory() as cache, datasets_offline():
        try:
            ds = datasets.load_dataset(
                "text",
                # datasets reads data_files as glob patterns: notes[1].txt would read notes1.txt
                data_files={"train": [glob.escape(str(f)) for f in files]},
                sample_by=mode,
                encoding="utf-8-sig",  # a file's leading byte-order mark (Windows editors) is no text
                split="train",
                cache_dir=cache,
            )
        except datasets.exceptions.DatasetGenerationError as err:
            _read_plain(files, paragraphs)  # re-reads to name the offending file (e.g. not UTF-8)
            raise ValueError(f"{files[0].parent}: datasets could not read the text files ({err})") from err
        finally:
            if not bars_were_off:
                datasets.utils.enable_progress_bars()
        texts = list(ds["text"])
    if not paragraphs and len(texts) != len(files):
        raise ValueError(f"datasets returned {len(texts)} documents for {len(files)} files")
    return texts


def text_documents(
    path: str | Path, use_datasets: bool | None = None, split: str | None = None, exclude: Path | None = None
) -> dict[str, list[str]]:
    """Documents of a local file or folder by split (md5 rule, or all in ``split`` in file order); read
    through ``datasets`` when installed (or asked). Files under ``exclude`` (the output folder): not read."""
    root = Path(path)
    files = [f for f in list_text_files(root, exclude) if f.stat().st_size]  # empty files hold no document
    single = root.is_file()
    if not files:
        raise ValueError(f"{root}: empty text file" if single else f"{root}: every text file in it is empty")
    if use_datasets is None:
        try:
            import datasets  # noqa: F401

            use_datasets = True
        except ImportError:
            use_datasets = False
    texts = (_read_datasets if use_datasets else _read_plain)(files, single)
    keys = (
        [f"{root.name}#{i}" for i in range(len(texts))]
        if single
        else [f.relative_to(root).as_posix() for f in files]
    )
    by_split: dict[str, list[tuple[int, str]]] = {s: [] for s in ([split] if split else SPLITS)}
    for i, (key, text) in enumerate(zip(keys, texts)):
        if text.strip():
            by_split[split or md5_split(key)].append((i if split else md5_int(key), text))
    if not any(by_split.values()):
        what = "" if single else f" ({len(files)} files, e.g. {files[0]})"
        raise ValueError(f"{root}: no text, only whitespace{what}")
    return {s: [t for _, t in sorted(docs, key=lambda d: d[0])] for s, docs in by_split.items()}
