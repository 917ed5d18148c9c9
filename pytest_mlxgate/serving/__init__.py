"""The serving path run by the gates' arms: batched decoding through each arm's real KV caches."""
