"""Operations: resuming and checking a run folder, reuse across methods, --check, --plan, --report-to.
A first read of the method can skip this folder."""
