"""The paper's data: its data sets and flags, searchqa's retrievers and LLM judge, JSON over HTTP."""
