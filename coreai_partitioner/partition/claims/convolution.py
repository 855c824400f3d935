"""Rules for the converter's convolution ops."""
