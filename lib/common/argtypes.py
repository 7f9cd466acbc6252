"""Numbers on a command line (argparse `type=`): every number finite, range-checked, argparse's error naming the
flag. Every CLI, and the modules that add their own flags, share them."""
import argparse
import math


def number(text, kind, minimum, strict, maximum=None, strict_max=False):
    """`text` as int or float, at least (strict: above) `minimum` and, given `maximum`, at most (strict_max:
    below) it; never inf or nan; else argparse's error names the flag."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    if not (value > minimum if strict else value >= minimum):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum}, got {text}")
    if maximum is not None and not (value < maximum if strict_max else value <= maximum):
        raise argparse.ArgumentTypeError(f"must be {'<' if strict_max else '<='} {maximum}, got {text}")
    return value


def positive_int(text):
    return number(text, int, 1, strict=False)


def nonnegative_int(text):
    return number(text, int, 0, strict=False)


def positive_float(text):
    return number(text, float, 0, strict=True)


def nonnegative_float(text):
    return number(text, float, 0, strict=False)


def share(text):
    """A share in [0, 1], e.g. of a phase's episodes."""
    return number(text, float, 0, strict=False, maximum=1)


def unit_interval(text):
    """A share in (0, 1], e.g. of GPU memory."""
    return number(text, float, 0, strict=True, maximum=1)


def probability(text):
    """A probability in [0, 1), e.g. a dropout rate (1 would drop everything)."""
    return number(text, float, 0, strict=False, maximum=1, strict_max=True)


def seed_int(text):
    """A seed torch, random and numpy all take."""
    return number(text, int, 0, strict=False, maximum=2 ** 32 - 1)
