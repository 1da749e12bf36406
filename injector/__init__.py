"""Injector: turns a recall result into bucketed prompt blocks."""
