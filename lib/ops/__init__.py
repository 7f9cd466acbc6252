"""Operations on a run before it starts, for plan.py: the preflight (--check) with its Gated DeltaNet probe and
compiler check, the hub look-ups, the time model.
A first read of the method can skip this folder."""
