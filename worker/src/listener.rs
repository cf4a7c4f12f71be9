//! The accepted connections, with each socket read capped in size and the
//! time of their last traffic recorded (for the idle timeout of
//! [`crate::server`]).
//!
//! hyper's HTTP/1 read buffer grows with the reads that fill it, up to about
//! 400 KiB per connection, and a request body is handed over as slices of
//! that buffer, so a body that arrives faster than it is consumed (an upload
//! over a fast link) costs two or three such buffers per connection. Capping
//! every read at [`READ_CAP`] bytes keeps the buffer near that size: 16
//! parallel 2 MiB uploads then cost the api a few MiB instead of ~20
//! (BENCHMARKS.md). JSON requests are far below the cap and unaffected.

use std::{
    io::Result as IoResult,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Instant,
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest single read from a client socket, in bytes (32 KiB).
pub const READ_CAP: usize = 32 * 1024;

/// A connection whose reads return at most `cap` bytes each; writes pass
/// through. With [`CappedIo::with_activity`], every read or write that moves
/// bytes stores the milliseconds since `start` in the shared counter.
pub struct CappedIo<T> {
    inner: T,
    cap: usize,
    activity: Option<(Instant, Arc<AtomicU64>)>,
}

impl<T> CappedIo<T> {
    /// Wraps `inner`; `cap` is at least 1 byte.
    pub fn new(inner: T, cap: usize) -> Self {
        CappedIo {
            inner,
            cap: cap.max(1),
            activity: None,
        }
    }

    /// Records the time of the last traffic in `last` (milliseconds since `start`).
    pub fn with_activity(mut self, start: Instant, last: Arc<AtomicU64>) -> Self {
        self.activity = Some((start, last));
        self
    }

    fn touch(&self, moved: usize) {
        if let (Some((start, last)), true) = (&self.activity, moved > 0) {
            last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CappedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<IoResult<()>> {
        let cap = self.cap;
        if buf.remaining() <= cap {
            let before = buf.filled().len();
            let res = Pin::new(&mut self.inner).poll_read(cx, buf);
            self.touch(buf.filled().len() - before);
            return res;
        }
        // Read into the first `cap` bytes of the caller's buffer only
        // (initialised first, so no unsafe code is needed to hand them back).
        let window = buf.initialize_unfilled_to(cap);
        let mut limited = ReadBuf::new(window);
        let res = Pin::new(&mut self.inner).poll_read(cx, &mut limited);
        let n = limited.filled().len();
        buf.advance(n);
        self.touch(n);
        res
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CappedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<IoResult<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = res {
            self.touch(n);
        }
        res
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoResult<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoResult<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<IoResult<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = res {
            self.touch(n);
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::CappedIo;

    #[tokio::test]
    async fn reads_are_capped_and_nothing_is_lost() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&data).await.unwrap();
        drop(client);
        let mut io = CappedIo::new(server, 1000);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = io.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            assert!(n <= 1000, "a read returned {n} bytes");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, data);
    }
}
