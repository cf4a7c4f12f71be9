//! The accepted connections, with each socket read capped in size.
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
    task::{Context, Poll},
};

use poem::{
    listener::Acceptor,
    web::{LocalAddr, RemoteAddr},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest single read from a client socket, in bytes (32 KiB).
pub const READ_CAP: usize = 32 * 1024;

/// An [`Acceptor`] whose connections read at most `cap` bytes per call.
pub struct CappedReads<A> {
    inner: A,
    cap: usize,
}

impl<A> CappedReads<A> {
    /// Wraps `inner`; `cap` is at least 1 byte.
    pub fn new(inner: A, cap: usize) -> Self {
        Self {
            inner,
            cap: cap.max(1),
        }
    }
}

impl<A: Acceptor> Acceptor for CappedReads<A> {
    type Io = CappedIo<A::Io>;

    fn local_addr(&self) -> Vec<LocalAddr> {
        self.inner.local_addr()
    }

    async fn accept(
        &mut self,
    ) -> IoResult<(Self::Io, LocalAddr, RemoteAddr, poem::http::uri::Scheme)> {
        let (io, local, remote, scheme) = self.inner.accept().await?;
        Ok((
            CappedIo {
                inner: io,
                cap: self.cap,
            },
            local,
            remote,
            scheme,
        ))
    }
}

/// A connection whose reads return at most `cap` bytes each; writes pass through.
pub struct CappedIo<T> {
    inner: T,
    cap: usize,
}

impl<T: AsyncRead + Unpin> AsyncRead for CappedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<IoResult<()>> {
        let cap = self.cap;
        if buf.remaining() <= cap {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        // Read into the first `cap` bytes of the caller's buffer only
        // (initialised first, so no unsafe code is needed to hand them back).
        let window = buf.initialize_unfilled_to(cap);
        let mut limited = ReadBuf::new(window);
        let res = Pin::new(&mut self.inner).poll_read(cx, &mut limited);
        let n = limited.filled().len();
        buf.advance(n);
        res
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CappedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<IoResult<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
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
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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
        let mut io = CappedIo {
            inner: server,
            cap: 1000,
        };
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
