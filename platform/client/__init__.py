"""The Python client: producers, consumers, allocation strategies, admin."""
