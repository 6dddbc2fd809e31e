"""The fleet: several engine replicas behind a router (core.fleet.router), optionally with
prefill and decode on different replicas and the KV cache moved between them over a link
(core.fleet.link), simulated on one virtual clock (core.fleet.sim)."""
