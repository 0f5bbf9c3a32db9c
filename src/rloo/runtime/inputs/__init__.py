"""What a run is given, checked before it starts: model, tokenizer and dataset names (names), their
content fingerprints for resume (fingerprint), safetensors headers (weightfiles), context and memory
sizes (sizes), the user's Python code (user_code), the objects the Python API is handed (objects), and
what rloo reads of a transformers model or tokenizer that may be missing (hf)."""
