"""Command lines: an argparse whose errors are one line naming the flag and the fix, and the number checks
every CLI shares (argparse `type=`)."""

import argparse



class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag and the fix, before any work (-h shows the usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def number(text, kind, minimum, strict):
    """`text` as int or float, at least (strict: above) `minimum`; else argparse's error names the flag."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not (value > minimum if strict else value >= minimum):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum}, got {text}")
    return value


def positive_int(text):
    return number(text, int, 1, strict=False)


def nonnegative_int(text):
    return number(text, int, 0, strict=False)


def positive_float(text):
    return number(text, float, 0, strict=True)


def nonnegative_float(text):
    return number(text, float, 0, strict=False)
