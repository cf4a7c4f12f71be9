//! SMTP sink: a real SMTP server inside the test process ([`SmtpSink`], [`Mail`]).

use super::*;

/// One message received by the [`SmtpSink`].
#[derive(Debug, Clone)]
pub struct Mail {
    /// `MAIL FROM` address.
    pub envelope_from: String,
    /// `RCPT TO` addresses.
    pub envelope_to: Vec<String>,
    /// The message as received (dot-unstuffed), headers and body.
    pub data: String,
}

impl Mail {
    fn split(&self) -> (&str, &str) {
        let d = self.data.as_str();
        match d.find("\r\n\r\n") {
            Some(i) => (&d[..i], &d[i + 4..]),
            None => match d.find("\n\n") {
                Some(i) => (&d[..i], &d[i + 2..]),
                None => (d, ""),
            },
        }
    }

    /// Header lines, unfolded, as (name, raw value).
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for line in self.split().0.lines() {
            if line.starts_with([' ', '\t']) {
                if let Some(last) = out.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(line.trim());
                }
            } else if let Some((n, v)) = line.split_once(':') {
                out.push((n.trim().to_string(), v.trim().to_string()));
            }
        }
        out
    }

    /// The first header `name` (case-insensitive), RFC 2047 encoded words decoded.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers()
            .into_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| decode_words(&v))
    }

    /// Every header named `name`.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers()
            .into_iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| decode_words(&v))
            .collect()
    }

    /// The decoded part of content type `content_type` (`text/plain`,
    /// `text/html`) of a multipart message; the body of a single-part one
    /// of that type; empty when there is none.
    pub fn part(&self, content_type: &str) -> String {
        let ct = self.header("content-type").unwrap_or_default();
        let boundary = ct.split(';').find_map(|p| {
            p.trim()
                .strip_prefix("boundary=")
                .map(|b| b.trim_matches('"').to_string())
        });
        let Some(boundary) = boundary else {
            return if ct.to_ascii_lowercase().starts_with(content_type) {
                self.body()
            } else {
                String::new()
            };
        };
        for chunk in self.split().1.split(&format!("--{boundary}")) {
            let part = Mail {
                envelope_from: String::new(),
                envelope_to: vec![],
                data: chunk.trim_start_matches(['\r', '\n']).to_string(),
            };
            let found = part.part(content_type);
            if !found.is_empty() {
                return found;
            }
        }
        String::new()
    }

    /// Every text part decoded from its `Content-Transfer-Encoding`
    /// (quoted-printable, base64, 7bit, 8bit), multipart entities walked
    /// recursively, joined by newlines: a single-part text message is its
    /// decoded [`Mail::body`]. Parts of another type (images, attachments)
    /// are left out.
    pub fn text(&self) -> String {
        let ct = self.header("content-type").unwrap_or_default();
        let lower = ct.to_ascii_lowercase();
        if !lower.starts_with("multipart/") {
            let text = lower.is_empty() || lower.starts_with("text/");
            return if text { self.body() } else { String::new() };
        }
        let Some(boundary) = ct.split(';').find_map(|p| {
            p.trim()
                .strip_prefix("boundary=")
                .map(|b| b.trim_matches('"').to_string())
        }) else {
            return String::new();
        };
        self.split()
            .1
            .split(&format!("--{boundary}"))
            .skip(1)
            .filter(|chunk| !chunk.starts_with("--"))
            .map(|chunk| {
                Mail {
                    envelope_from: String::new(),
                    envelope_to: vec![],
                    data: chunk.trim_start_matches(['\r', '\n']).to_string(),
                }
                .text()
            })
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The whole message (headers and every part) with quoted-printable's
    /// soft line breaks and `=3D` undone: the text the tests search for a
    /// mail's links, `token_hash` and code, whichever part carries them.
    pub fn searchable(&self) -> String {
        self.data
            .replace("=\r\n", "")
            .replace("=\n", "")
            .replace("=3D", "=")
    }

    /// The body decoded from its `Content-Transfer-Encoding` (7bit, 8bit,
    /// quoted-printable, base64). Single-part messages only.
    pub fn body(&self) -> String {
        let raw = self.split().1;
        let cte = self
            .header("content-transfer-encoding")
            .unwrap_or_default()
            .to_ascii_lowercase();
        match cte.as_str() {
            "quoted-printable" => {
                String::from_utf8_lossy(&decode_qp(raw.as_bytes(), false)).to_string()
            }
            "base64" => String::from_utf8_lossy(&decode_b64(raw)).to_string(),
            _ => raw.to_string(),
        }
    }
}

fn decode_b64(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

fn decode_qp(s: &[u8], underscore_space: bool) -> Vec<u8> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'=' if s.get(i + 1) == Some(&b'\r') && s.get(i + 2) == Some(&b'\n') => i += 3,
            b'=' if s.get(i + 1) == Some(&b'\n') => i += 2,
            b'=' => match (
                s.get(i + 1).and_then(|c| hex(*c)),
                s.get(i + 2).and_then(|c| hex(*c)),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                }
                _ => {
                    out.push(b'=');
                    i += 1;
                }
            },
            b'_' if underscore_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Decodes RFC 2047 encoded words (`=?utf-8?b?…?=`, `=?utf-8?q?…?=`).
fn decode_words(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    let mut last_was_word = false;
    while let Some(start) = rest.find("=?") {
        let before = &rest[..start];
        let after = &rest[start + 2..];
        let parts: Vec<&str> = after.splitn(3, '?').collect();
        if parts.len() == 3 {
            if let Some(end) = parts[2].find("?=") {
                let text = &parts[2][..end];
                let decoded = match parts[1].to_ascii_lowercase().as_str() {
                    "b" => decode_b64(text),
                    _ => decode_qp(text.as_bytes(), true),
                };
                if !(last_was_word && before.trim().is_empty()) {
                    out.push_str(before);
                }
                out.push_str(&String::from_utf8_lossy(&decoded));
                let consumed = start + 2 + parts[0].len() + 1 + parts[1].len() + 1 + end + 2;
                rest = &rest[consumed..];
                last_was_word = true;
                continue;
            }
        }
        out.push_str(&rest[..start + 2]);
        rest = &rest[start + 2..];
        last_was_word = false;
    }
    out.push_str(rest);
    out
}

#[derive(Default)]
struct SinkState {
    mails: Mutex<Vec<Mail>>,
    in_data: AtomicUsize,
    connections: AtomicUsize,
}

/// A real SMTP server on `127.0.0.1:<free port>` inside the test process:
/// EHLO/HELO, MAIL FROM, RCPT TO, DATA, RSET, NOOP, QUIT; any number of
/// concurrent connections and messages per connection. Every accepted
/// message is recorded. Stops on drop.
pub struct SmtpSink {
    /// Listening address.
    pub addr: SocketAddr,
    state: Arc<SinkState>,
    task: JoinHandle<()>,
}

impl SmtpSink {
    /// Starts a sink that accepts at once.
    pub async fn start() -> Self {
        Self::start_with_delay(Duration::ZERO).await
    }

    /// Starts a sink that waits `delay` after receiving a message before
    /// answering `250` (the message counts as received only then).
    pub async fn start_with_delay(delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind SMTP sink");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(SinkState::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut sessions = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((sock, _)) = accepted else { continue };
                        st.connections.fetch_add(1, Ordering::SeqCst);
                        let st = st.clone();
                        sessions.spawn(async move {
                            let _ = smtp_session(sock, st, delay).await;
                        });
                    }
                    Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                }
            }
        });
        SmtpSink { addr, state, task }
    }

    /// `smtp://127.0.0.1:PORT` (plain SMTP) for `SMTP_URL`.
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    /// Messages received so far.
    pub fn mails(&self) -> Vec<Mail> {
        self.state.mails.lock().expect("lock").clone()
    }

    /// How many messages were received.
    pub fn count(&self) -> usize {
        self.state.mails.lock().expect("lock").len()
    }

    /// Sessions currently inside DATA (message being received, not yet answered).
    pub fn in_data(&self) -> usize {
        self.state.in_data.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` messages arrived; returns them.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Mail> {
        let ok = wait_until(timeout, || async { self.count() >= n }).await;
        assert!(
            ok,
            "SMTP sink got {} of {n} expected messages within {timeout:?}",
            self.count()
        );
        self.mails()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn angle_addr(arg: &str) -> String {
    let a = arg.trim();
    let inner = match (a.find('<'), a.find('>')) {
        (Some(s), Some(e)) if e > s => &a[s + 1..e],
        _ => a.split_whitespace().next().unwrap_or(""),
    };
    inner.to_string()
}

async fn smtp_session(sock: TcpStream, st: Arc<SinkState>, delay: Duration) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut r = TokioBufReader::new(r);
    w.write_all(b"220 sink.test ESMTP test sink\r\n").await?;
    let mut from = String::new();
    let mut to: Vec<String> = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        let upper = text.to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("EHLO") {
            b"250-sink.test\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 10485760\r\n"
        } else if upper.starts_with("HELO") {
            b"250 sink.test\r\n"
        } else if upper.starts_with("MAIL FROM:") {
            from = angle_addr(&text[10..]);
            to.clear();
            b"250 2.1.0 OK\r\n"
        } else if upper.starts_with("RCPT TO:") {
            to.push(angle_addr(&text[8..]));
            b"250 2.1.5 OK\r\n"
        } else if upper == "DATA" {
            if to.is_empty() {
                w.write_all(b"503 5.5.1 RCPT first\r\n").await?;
                continue;
            }
            w.write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                .await?;
            st.in_data.fetch_add(1, Ordering::SeqCst);
            let mut data: Vec<u8> = Vec::new();
            let ended = loop {
                line.clear();
                if r.read_until(b'\n', &mut line).await? == 0 {
                    break false;
                }
                if line == b".\r\n" || line == b".\n" {
                    break true;
                }
                if line.starts_with(b"..") {
                    data.extend_from_slice(&line[1..]);
                } else {
                    data.extend_from_slice(&line);
                }
            };
            if !ended {
                st.in_data.fetch_sub(1, Ordering::SeqCst);
                return Ok(());
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            st.mails.lock().expect("lock").push(Mail {
                envelope_from: std::mem::take(&mut from),
                envelope_to: std::mem::take(&mut to),
                data: String::from_utf8_lossy(&data).to_string(),
            });
            st.in_data.fetch_sub(1, Ordering::SeqCst);
            b"250 2.0.0 OK queued\r\n"
        } else if upper == "RSET" {
            from.clear();
            to.clear();
            b"250 2.0.0 OK\r\n"
        } else if upper.starts_with("NOOP") {
            b"250 2.0.0 OK\r\n"
        } else if upper == "QUIT" {
            w.write_all(b"221 2.0.0 Bye\r\n").await?;
            return Ok(());
        } else {
            b"502 5.5.2 Command not implemented\r\n"
        };
        w.write_all(reply).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_walks_every_text_part_and_decodes_it() {
        let data = "Subject: x\r\nContent-Type: multipart/mixed; boundary=\"out\"\r\n\r\n\
            preamble\r\n--out\r\nContent-Type: multipart/alternative; boundary=in\r\n\r\n\
            --in\r\nContent-Type: text/plain; charset=utf-8\r\n\
            Content-Transfer-Encoding: quoted-printable\r\n\r\n\
            https://a.test/verify?token=3Dabc&type=3Dsignup=\r\n&x=3D1 caf=C3=A9\r\n\
            --in\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n\
            PGI+aGk8L2I+\r\n--in--\r\n\
            --out\r\nContent-Type: image/png\r\nContent-Transfer-Encoding: base64\r\n\r\niVBORw0K\r\n\
            --out--\r\n";
        let mail = Mail {
            envelope_from: String::new(),
            envelope_to: vec![],
            data: data.to_string(),
        };
        let text = mail.text();
        assert!(
            text.contains("https://a.test/verify?token=abc&type=signup&x=1 café"),
            "{text:?}"
        );
        assert!(text.contains("<b>hi</b>"), "{text:?}");
        assert!(
            !text.contains("iVBOR") && !text.contains("preamble"),
            "{text:?}"
        );
    }
}
