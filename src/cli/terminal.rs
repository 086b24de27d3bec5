//! The operator's terminal stays the operator's: children never get it.
//! A child that wants a terminal gets a fresh pty whose output is relayed
//! here through [`Sanitizer`], which keeps text and plain colour (SGR) and
//! drops every other control sequence (titles, the OSC 52 clipboard, cursor
//! and mode changes) unless the operator asks for raw output. Text from
//! children and models printed by other commands goes through [`clean`].

use std::borrow::Cow;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::sys::termios::{self, SetArg, Termios};

/// Where the filter is inside an escape sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    /// After ESC.
    Escape,
    /// Inside `ESC [` … (parameters so far kept in `csi`).
    Csi,
    /// Inside a string sequence (OSC, DCS, APC, PM, SOS) until BEL or ST.
    Str,
    /// ESC seen inside a string sequence (ST is `ESC \`).
    StrEscape,
    /// 0xC2 seen in text: U+0080–U+009F (C1 controls) start with it.
    Lead,
    /// 0xC2 seen inside a string sequence (ST may be U+009C).
    StrLead,
}

/// A streaming filter of terminal output; sequences may be split anywhere
/// across calls.
#[derive(Debug)]
pub struct Sanitizer {
    raw: bool,
    state: State,
    csi: Vec<u8>,
}

/// Longest CSI kept whole; a longer one is dropped.
const MAX_CSI: usize = 64;

impl Sanitizer {
    pub fn new(raw: bool) -> Self {
        Self {
            raw,
            state: State::Text,
            csi: Vec::new(),
        }
    }

    /// Filter `input`, appending what may reach the terminal to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.raw {
            out.extend_from_slice(input);
            return;
        }
        for &b in input {
            self.state = match self.state {
                State::Text => match b {
                    0x1b => State::Escape,
                    0xc2 => State::Lead,
                    b'\n' | b'\r' | b'\t' | 0x08 => {
                        out.push(b);
                        State::Text
                    }
                    0x00..=0x1f | 0x7f => State::Text,
                    _ => {
                        out.push(b);
                        State::Text
                    }
                },
                // C1 controls are code points U+0080–U+009F in UTF-8 text
                // (a terminal in UTF-8 mode obeys them): CSI, the string
                // introducers, and the rest dropped.
                State::Lead => match b {
                    0x9b => {
                        self.csi.clear();
                        State::Csi
                    }
                    0x90 | 0x98 | 0x9d | 0x9e | 0x9f => State::Str,
                    0x80..=0x9f => State::Text,
                    _ => {
                        out.push(0xc2);
                        if b == 0xc2 {
                            State::Lead
                        } else {
                            out.push(b);
                            State::Text
                        }
                    }
                },
                State::Escape => match b {
                    b'[' => {
                        self.csi.clear();
                        State::Csi
                    }
                    b']' | b'P' | b'_' | b'^' | b'X' => State::Str,
                    // Any other escape (charset, keypad, reset…) is dropped.
                    _ => State::Text,
                },
                State::Csi => {
                    if (0x40..=0x7e).contains(&b) {
                        if b == b'm' && self.csi.iter().all(|c| c.is_ascii_digit() || *c == b';') {
                            out.extend_from_slice(b"\x1b[");
                            out.extend_from_slice(&self.csi);
                            out.push(b'm');
                        }
                        State::Text
                    } else if self.csi.len() < MAX_CSI {
                        self.csi.push(b);
                        State::Csi
                    } else {
                        // Too long to be a colour: drop the rest of it.
                        self.csi.push(b);
                        State::Csi
                    }
                }
                State::Str => match b {
                    0x07 => State::Text,
                    0x1b => State::StrEscape,
                    0xc2 => State::StrLead,
                    _ => State::Str,
                },
                State::StrLead => match b {
                    0x9c => State::Text,
                    0x1b => State::StrEscape,
                    _ => State::Str,
                },
                State::StrEscape => match b {
                    b'\\' => State::Text,
                    0x1b => State::StrEscape,
                    _ => State::Str,
                },
            };
        }
    }
}

/// `text` with every control sequence but plain colour removed (for text
/// from children and models printed by the CLI).
pub fn clean(text: &str) -> Cow<'_, str> {
    let plain = |b: u8| (b >= 0x20 && b != 0x7f && b != 0xc2) || b == b'\n' || b == b'\t';
    if text.bytes().all(plain) {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len());
    Sanitizer::new(false).push(text.as_bytes(), &mut out);
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: BorrowedFd<'_>) -> bool {
    nix::unistd::isatty(fd).unwrap_or(false)
}

/// Puts a terminal in raw mode and restores its exact modes when dropped
/// (also on an error path), whatever the child did to its own pty.
pub struct RawMode {
    fd: OwnedFd,
    saved: Termios,
}

impl RawMode {
    pub fn enter(fd: BorrowedFd<'_>) -> std::io::Result<Self> {
        let saved = termios::tcgetattr(fd)?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(fd, SetArg::TCSANOW, &raw)?;
        Ok(Self {
            fd: fd.try_clone_to_owned()?,
            saved,
        })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(self.fd.as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

/// A pty for a child: the child gets `slave` as its terminal; the operator's
/// terminal only sees what [`relay_output`] lets through.
pub struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Open a pty whose size and modes start as the operator's terminal's
/// (`like`); changes the child makes stay on the pty.
pub fn open_pty(like: BorrowedFd<'_>) -> std::io::Result<Pty> {
    let modes = termios::tcgetattr(like).ok();
    let size = window_size(like);
    let p = nix::pty::openpty(size.as_ref(), modes.as_ref())?;
    Ok(Pty {
        master: p.master,
        slave: p.slave,
    })
}

nix::ioctl_read_bad!(tiocgwinsz, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

fn window_size(fd: BorrowedFd<'_>) -> Option<nix::pty::Winsize> {
    let mut ws = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills the struct we pass; the fd is borrowed.
    unsafe { tiocgwinsz(fd.as_raw_fd(), &mut ws) }.ok()?;
    Some(ws)
}

/// Copy the pty's output to `out`, sanitized, until the pty closes (every
/// holder of the slave is gone: the read fails with EIO).
pub(crate) fn relay_output(master: &OwnedFd, raw: bool, out: &mut dyn Write) {
    let mut file = match master.try_clone() {
        Ok(fd) => std::fs::File::from(fd),
        Err(_) => return,
    };
    let mut filter = Sanitizer::new(raw);
    let mut buf = [0u8; 16 * 1024];
    let mut clean = Vec::with_capacity(buf.len());
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        clean.clear();
        filter.push(&buf[..n], &mut clean);
        if out.write_all(&clean).and_then(|()| out.flush()).is_err() {
            break;
        }
    }
}

/// Copy the operator's input to the pty until it ends; a non-terminal
/// input that ends sends the pty's end-of-file character.
pub(crate) fn relay_input(master: &OwnedFd, input_is_terminal: bool) {
    let Ok(fd) = master.try_clone() else {
        return;
    };
    let mut pty = std::fs::File::from(fd);
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 4096];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if pty.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
    if !input_is_terminal {
        let _ = pty.write_all(&[0x04]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &[&[u8]]) -> Vec<u8> {
        let mut s = Sanitizer::new(false);
        let mut out = Vec::new();
        for chunk in input {
            s.push(chunk, &mut out);
        }
        out
    }

    #[test]
    fn keeps_text_and_colour() {
        assert_eq!(
            run(&[b"plain \x1b[1;31mred\x1b[0m\n"]),
            b"plain \x1b[1;31mred\x1b[0m\n"
        );
        assert_eq!(run(&["中文\tok\r\n".as_bytes()]), "中文\tok\r\n".as_bytes());
    }

    #[test]
    fn drops_osc_dcs_and_other_csi_even_when_split() {
        let input: &[&[u8]] = &[
            b"a\x1b]52;c;SGVs",
            b"bG8=\x07b\x1b]0;title\x1b",
            b"\\c\x1b[2J\x1b[?1049h\x1bPq#0\x1b\\d\x1b[",
            b"32md\x07\x00e",
        ];
        assert_eq!(run(input), b"abcd\x1b[32mde");
    }

    #[test]
    fn c1_controls_in_utf8_are_controls_and_other_text_is_kept() {
        // U+009B is CSI, U+009D OSC, U+009C ST; "é" (C3 A9) and "¢" (C2 A2)
        // are text.
        assert_eq!(
            run(&["x\u{9b}2Jy\u{9d}0;t\u{9c}z é¢".as_bytes()]),
            "xyz é¢".as_bytes()
        );
        // Split between the two bytes of a C1 control.
        assert_eq!(run(&[b"a\xc2", b"\x9d52;c;QQ==\x07b"]), b"ab");
        assert_eq!(clean("ok 中文"), "ok 中文");
        assert_eq!(clean("a\u{1b}]52;c;QQ==\u{7}b\u{9b}2Jc"), "abc");
        assert_eq!(clean("a\u{1b}[31mb"), "a\u{1b}[31mb");
    }

    #[test]
    fn raw_passes_everything() {
        let mut s = Sanitizer::new(true);
        let mut out = Vec::new();
        s.push(b"\x1b]52;c;QQ==\x07", &mut out);
        assert_eq!(out, b"\x1b]52;c;QQ==\x07");
    }
}
