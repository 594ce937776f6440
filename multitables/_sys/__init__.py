"""What every layer may use: how the library meets the operating system's signals, the checks of the public faces' arguments,
whether a buffer is still referenced, work on a thread of its own, and module locks made anew in a forked child."""
