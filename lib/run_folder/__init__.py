"""A run's folder: the ledger of finished work (resume, repair, cross-method reuse), its files, and its rows sent live
(--report-to)."""
