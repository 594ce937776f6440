"""What the operating system does to the library: signals."""
