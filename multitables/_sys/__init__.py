"""What every layer may use: how the library meets the operating system's signals, and the checks of the public faces' arguments."""
