"""What a run is given, checked before it starts: model, tokenizer and dataset names (names), their
content fingerprints for resume (fingerprint), safetensors headers (weightfiles), context and memory
sizes (sizes), and the user's Python code (user_code)."""
