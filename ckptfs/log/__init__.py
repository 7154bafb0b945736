"""The metadata log: the intent journal, trusted loading and replay."""
