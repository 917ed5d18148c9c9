"""Levers: what differs between a gate's reference arm and its candidate arm, and how it is applied."""
