"""A run's folder: the store of finished work beside it (every method's and every later command's reuse), the
ledger of its rows (its state and resume), its files, and its rows sent live (--report-to)."""
