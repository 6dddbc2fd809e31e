"""Experiments over simulations: load sweeps and capacity searches, on one engine (core.sim) or a
fleet (core.fleet). A layer above both, so neither imports the other's callers."""
