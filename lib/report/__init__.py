"""The report's reading of run folders, the paper's claims, the figures and the bootstrap intervals."""
