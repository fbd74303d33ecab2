"""The broker: topic table, client manager, offsets, queue locks, send/pull processors."""
