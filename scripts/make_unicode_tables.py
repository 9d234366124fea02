#!/usr/bin/env python3
"""Writes csrc/tokenizer/unicode_tables.inc: the Unicode data the tokenizer's pre-tokenizer patterns
and normalizers need, as compact sorted range tables (binary-searched in csrc/tokenizer/unicode.cpp).

  scripts/make_unicode_tables.py [output]     (default csrc/tokenizer/unicode_tables.inc)

Unicode versions: the categories and White_Space are Unicode 16.0.0, the version of Oniguruma
6.9.10, the regex engine Hugging Face `tokenizers` matches its patterns with (checked: U+1E5D0, a
letter new in 16.0, is \\p{L} there; U+16EA0, new in 17.0, is not). Python's own `unicodedata` is
older (3.11: 14.0), so the script reads the `unicodedata2` backport pinned to that version:
pip install unicodedata2==16.0.0. The NFC data are Unicode 9.0, the version of the normalization
crate `tokenizers` uses (unicode-normalization-alignments; checked: U+1E944, a mark of 9.0, is
reordered there, U+1DF6 of 10.0 is not): the 16.0 data restricted to code points assigned by 9.0
(normalization data of an assigned code point never change), the ages from DerivedAge.txt
(Debian's unicode-data package: /usr/share/unicode/DerivedAge.txt, or give its path as the second
argument).

Tables:
  kCategoryRanges   {first, last, category}: maximal runs of code points of one general category
                    among L* (Lu Ll Lt Lm Lo), M* (Mn Mc Me) and N* (Nd Nl No); others are absent.
  kWhiteSpace       the White_Space property (PropList.txt; \\s of Oniguruma and Rust), as ranges.
  kCombiningClass   {first, last, ccc}: runs of one non-zero canonical combining class.
  kDecomposition    {code point, offset, length} into kDecompositionData: full canonical
                    decompositions (recursively expanded), Hangul syllables excluded (algorithmic).
  kComposition      {first, second, composite}: canonical pairs that NFC recomposes (primary
                    composites: not excluded, not singletons, not non-starter decompositions).
  (NFC tables: Unicode 9.0)
  kNfcQcNo          code points whose NFC_Quick_Check is No or Maybe, as ranges (a string free of
                    them and of Hangul jamo needs no NFC work).
"""
import sys

import unicodedata2 as ud

EXPECTED = "16.0.0"
if ud.unidata_version != EXPECTED:
    sys.exit(f"make_unicode_tables.py: unicodedata2 has Unicode {ud.unidata_version}, expected {EXPECTED}")

CATS = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No"]
# PropList.txt White_Space (stable since Unicode 6.3).
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
               (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
MAX = 0x110000
SBASE, SCOUNT = 0xAC00, 11172


def runs(values):
    """(first, last, value) for maximal runs of equal non-None values."""
    out, start, cur = [], None, None
    for cp in range(MAX + 1):
        v = values(cp) if cp < MAX else None
        if v != cur:
            if cur is not None:
                out.append((start, cp - 1, cur))
            start, cur = cp, v
    return out


def canonical(cp):
    d = ud.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def full_decomposition(cp):
    d = canonical(cp)
    if d is None:
        return [cp]
    out = []
    for x in d:
        out.extend(full_decomposition(x))
    return out


NFC_VERSION = (9, 0)


def assigned_by(version, derived_age):
    """Code points assigned in `version` or earlier, from DerivedAge.txt."""
    out = set()
    for line in open(derived_age, encoding="utf-8"):
        line = line.split("#")[0].strip()
        if not line:
            continue
        cps, age = (x.strip() for x in line.split(";"))
        if tuple(int(x) for x in age.split(".")) > version:
            continue
        a, _, b = cps.partition("..")
        out.update(range(int(a, 16), int(b or a, 16) + 1))
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "csrc/tokenizer/unicode_tables.inc"
    old = assigned_by(NFC_VERSION, sys.argv[2] if len(sys.argv) > 2 else "/usr/share/unicode/DerivedAge.txt")
    cat = runs(lambda cp: CATS.index(ud.category(chr(cp))) if ud.category(chr(cp)) in CATS else None)
    ccc = runs(lambda cp: (ud.combining(chr(cp)) or None) if cp in old else None)
    decomp = []
    for cp in range(MAX):
        if SBASE <= cp < SBASE + SCOUNT or 0xD800 <= cp < 0xE000:
            continue
        if cp in old and canonical(cp) is not None:
            decomp.append((cp, full_decomposition(cp)))
    comp = []
    for cp, _ in decomp:
        d = canonical(cp)
        if len(d) != 2 or ud.combining(chr(d[0])) != 0:
            continue
        # Composition exclusions: a pair whose composite NFC does not produce.
        if ud.normalize("NFC", chr(d[0]) + chr(d[1])) != chr(cp):
            continue
        comp.append((d[0], d[1], cp))
    comp.sort()
    # Any code point that can take part in a composition as the second element, or a combining mark,
    # or one that changes under NFC, makes NFC do work.
    second = sorted({b for _, b, _ in comp})
    need = set()
    for cp in old:
        if 0xD800 <= cp < 0xE000:
            continue
        if ud.normalize("NFC", chr(cp)) != chr(cp) or ud.combining(chr(cp)):
            need.add(cp)
    need.update(second)
    need.update(range(0x1100, 0x1200))  # Hangul jamo (L, V, T compose algorithmically)
    qc = runs(lambda cp: True if cp in need else None)

    with open(path, "w") as f:
        f.write(f"// Generated by scripts/make_unicode_tables.py from Unicode {EXPECTED} (unicodedata2); do not edit.\n")
        f.write("// Included by csrc/tokenizer/unicode.cpp only.\n")
        f.write(f"#define ENGINE_UNICODE_VERSION \"{EXPECTED}\"\n")
        f.write(f"#define ENGINE_NFC_UNICODE_VERSION \"{NFC_VERSION[0]}.{NFC_VERSION[1]}\"\n")
        f.write(f"static constexpr CategoryRange kCategoryRanges[{len(cat)}] = {{\n")
        for i in range(0, len(cat), 6):
            f.write("  " + " ".join(f"{{0x{a:X}, 0x{b:X}, {v}}}," for a, b, v in cat[i:i + 6]) + "\n")
        f.write("};\n")
        f.write(f"static constexpr Range kWhiteSpace[{len(WHITE_SPACE)}] = {{\n  ")
        f.write(" ".join(f"{{0x{a:X}, 0x{b:X}}}," for a, b in WHITE_SPACE) + "\n};\n")
        f.write(f"static constexpr CategoryRange kCombiningClass[{len(ccc)}] = {{\n")
        for i in range(0, len(ccc), 6):
            f.write("  " + " ".join(f"{{0x{a:X}, 0x{b:X}, {v}}}," for a, b, v in ccc[i:i + 6]) + "\n")
        f.write("};\n")
        data, rows = [], []
        for cp, d in decomp:
            rows.append((cp, len(data), len(d)))
            data.extend(d)
        f.write(f"static constexpr char32_t kDecompositionData[{len(data)}] = {{\n")
        for i in range(0, len(data), 10):
            f.write("  " + " ".join(f"0x{x:X}," for x in data[i:i + 10]) + "\n")
        f.write("};\n")
        f.write(f"static constexpr Decomposition kDecomposition[{len(rows)}] = {{\n")
        for i in range(0, len(rows), 6):
            f.write("  " + " ".join(f"{{0x{a:X}, {b}, {c}}}," for a, b, c in rows[i:i + 6]) + "\n")
        f.write("};\n")
        f.write(f"static constexpr Composition kComposition[{len(comp)}] = {{\n")
        for i in range(0, len(comp), 5):
            f.write("  " + " ".join(f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in comp[i:i + 5]) + "\n")
        f.write("};\n")
        f.write(f"static constexpr Range kNfcQcNo[{len(qc)}] = {{\n")
        for i in range(0, len(qc), 6):
            f.write("  " + " ".join(f"{{0x{a:X}, 0x{b:X}}}," for a, b, _ in qc[i:i + 6]) + "\n")
        f.write("};\n")
    print(f"{path}: {len(cat)} category runs, {len(ccc)} combining-class runs, {len(rows)} decompositions, "
          f"{len(comp)} compositions, {len(qc)} NFC-check runs (Unicode {EXPECTED}, NFC {NFC_VERSION})")


if __name__ == "__main__":
    main()
