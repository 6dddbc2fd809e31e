"""KV cache tiers below the GPU pool (a CPU tier under the prefix cache: core.kvtier.tier)."""
