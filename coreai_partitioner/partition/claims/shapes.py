"""Rules for the converter's shapes ops."""
