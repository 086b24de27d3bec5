fn main() -> std::process::ExitCode {
    mini_letta::cli::main()
}

/// `mini-letta --version` (or `-V`) alone is answered here, from the C
/// runtime's constructors, before Rust's own start-up (which reads
/// `/proc/self/maps` to find the main thread's stack guard) and before the
/// parser is built: a script asking for the version waits for little more
/// than the dynamic loader. The text is the parser's (a test compares).
mod quick_version {
    use std::ffi::{CStr, c_char, c_int};

    extern "C" fn answer(argc: c_int, argv: *const *const c_char, _env: *const *const c_char) {
        if argc != 2 || argv.is_null() {
            return;
        }
        // SAFETY: the C runtime passes the program's argv, `argc` entries
        // long, each a NUL-terminated string.
        let flag = unsafe { CStr::from_ptr(*argv.add(1)) }.to_bytes();
        if flag != b"--version" && flag != b"-V" {
            return;
        }
        let line = concat!("mini-letta ", env!("CARGO_PKG_VERSION"), "\n").as_bytes();
        // SAFETY: a write of a static buffer to stdout, then an exit that
        // runs nothing of the process (nothing has started yet).
        // A closed pipe is an EPIPE (as under Rust's runtime), not a signal.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let n = libc::write(1, line.as_ptr().cast(), line.len());
            let failed = n < 0 && *libc::__errno_location() != libc::EPIPE;
            libc::_exit(c_int::from(failed || (0..line.len() as isize).contains(&n)));
        }
    }

    #[used]
    #[unsafe(link_section = ".init_array")]
    static ANSWER: extern "C" fn(c_int, *const *const c_char, *const *const c_char) = answer;
}
