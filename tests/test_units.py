"""kvsim.units: byte counts, token counts and rates as people write them (docs/scenario.md,
"Numbers and units"); integers stay exact, anything else is refused with the valid forms."""

import pytest

from kvsim.units import parse_byte_rate, parse_bytes, parse_number, parse_tokens


@pytest.mark.parametrize("text, want", [
    (17179869184, 17179869184), ("16e9", 16_000_000_000), ("1.0e12", 10**12), (1.0e12, 10**12),
    ("16GB", 16 * 10**9), ("16 GiB", 16 * 2**30), ("1.5 GiB", 3 * 2**29), ("512MiB", 512 * 2**20),
    ("2 tb", 2 * 10**12), ("7 B", 7), ("1_000", 1000), (4.0, 4), ("1PiB", 2**50),
])
def test_bytes(text, want):
    got = parse_bytes(text)
    assert got == want and type(got) is int


def test_bytes_keep_large_integers_exact():
    assert parse_bytes(2**62 + 1) == 2**62 + 1
    assert parse_bytes("9007199254740993") == 9007199254740993  # 2^53 + 1: not a float


@pytest.mark.parametrize("bad, why", [
    ("16.5 B", "not a whole number of bytes"), (1.5, "not a whole number"), ("16 GX", "unknown unit 'GX'"),
    ("abc", "not a byte count"), (True, "expected a byte count"), ([1], "expected a byte count"),
    ("1e400x", "unknown unit"), ("0.1 B", "not a whole number"),
])
def test_bytes_refused_with_the_valid_forms(bad, why):
    with pytest.raises(ValueError) as e:
        parse_bytes(bad)
    msg = str(e.value)
    assert why in msg and "16 GiB" in msg and "\n" not in msg


@pytest.mark.parametrize("text, want", [
    (131072, 131072), ("1.28e5", 128_000), ("128k", 128_000), ("25.6k", 25_600), ("128K", 131_072),
    ("2M", 2 * 2**20), ("2m", 2_000_000), ("1g", 10**9), (8192.0, 8192), ("4 k", 4000),
])
def test_tokens(text, want):
    got = parse_tokens(text)
    assert got == want and type(got) is int


@pytest.mark.parametrize("bad, why", [
    (1.5, "not a whole number of tokens"), ("1.5K", "binary suffix"), ("128 kB", "unknown suffix 'kB'"),
    ("0.0001k", "not a whole number"), (False, "expected a token count"), ("x", "not a token count"),
])
def test_tokens_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_tokens(bad)


@pytest.mark.parametrize("text, want", [
    (64e9, 64e9), ("64e9", 64e9), ("25 GB/s", 25e9), ("2 TiB/s", 2.0 * 2**40), ("1.5TB/sec", 1.5e12), (10, 10.0),
])
def test_byte_rates(text, want):
    assert parse_byte_rate(text) == want


@pytest.mark.parametrize("bad", ["25 Gb/x", "fast", "25 XB/s", True])
def test_byte_rates_refused(bad):
    with pytest.raises(ValueError, match="25 GB/s"):
        parse_byte_rate(bad)


def test_numbers():
    assert parse_number("989e12") == 989e12 and parse_number(3) == 3.0 and parse_number(None) is None
    with pytest.raises(ValueError, match="not a number"):
        parse_number("12 flops")
    with pytest.raises(ValueError, match="finite"):
        parse_number(float("inf"))


@pytest.mark.parametrize("bad", ["25 Gb/s", "25 Gbit/s", "100 Mbps/s", "16 Gb", "1 Mib", "3 kbit"])
def test_bit_units_are_refused_not_read_as_bytes(bad):
    """QA (twenty-ninth session): '25 Gb/s', a NIC's speed in bits, was read as 25 GB/s (8x too fast)."""
    parse = parse_byte_rate if "/s" in bad else parse_bytes
    with pytest.raises(ValueError, match="reads as bits|unknown unit"):
        parse(bad)
    assert parse_bytes("16 gb") == 16 * 10**9 and parse_bytes("8 b") == 8  # lower-case prefixes stay bytes
