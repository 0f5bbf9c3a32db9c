"""The trainer's link to its asynchronous rollout producer (docs/async.md): the weight ring (weights),
the producer process's lifetime (child), its network address (address) and the two-process Gloo link
to a producer on another machine (gloo)."""
