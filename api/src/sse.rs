//! `SseStream<T>`: a `text/event-stream` answer (server-sent events, the HTML
//! Living Standard's "9.2 Server-sent events") whose events carry the JSON of
//! `T`, for poem-openapi routes.
//!
//! It documents itself exactly as poem-openapi's `EventStream<T>` does (an
//! array of `T` with format `event-stream`) but writes its body differently:
//! each event becomes one `Bytes` handed straight to hyper
//! (`Body::from_bytes_stream`), where poem's SSE response copies the events
//! through an `AsyncRead` adapter and a 4 KiB read buffer per response. For a
//! long-lived stream (the AI chat relays one for the whole answer) that buffer
//! is held for the stream's life: ~3.5 KiB and one copy of every chunk per
//! open stream saved.

use bytes::{BufMut, Bytes, BytesMut};
use futures::{stream::BoxStream, StreamExt};
use poem::{Body, IntoResponse, Response};
use poem_openapi::{
    payload::Payload,
    registry::{MetaSchema, MetaSchemaRef, Registry},
    types::Type,
};

/// A `text/event-stream` payload of `T`s; `data` gives each item's event data
/// (one `data:` line per line of it).
pub struct SseStream<T: Send + 'static> {
    stream: BoxStream<'static, T>,
    data: fn(T) -> String,
}

impl<T: Send + 'static> SseStream<T> {
    /// The events of `stream`, each written as `data: <data(item)>\n\n`.
    pub fn new(stream: BoxStream<'static, T>, data: fn(T) -> String) -> Self {
        Self { stream, data }
    }
}

/// One event: `data: <line>\n` per line of `data`, then an empty line.
fn event(data: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 8);
    for line in data.split('\n') {
        b.put_slice(b"data: ");
        b.put_slice(line.as_bytes());
        b.put_u8(b'\n');
    }
    b.put_u8(b'\n');
    b.freeze()
}

impl<T: Type + Send + 'static> Payload for SseStream<T> {
    const CONTENT_TYPE: &'static str = "text/event-stream";

    fn schema_ref() -> MetaSchemaRef {
        MetaSchemaRef::Inline(Box::new(MetaSchema {
            items: Some(Box::new(T::schema_ref())),
            ..MetaSchema::new_with_format("array", "event-stream")
        }))
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

impl<T: Send + 'static> IntoResponse for SseStream<T> {
    fn into_response(self) -> Response {
        let data = self.data;
        let body = self
            .stream
            .map(move |item| Ok::<_, std::io::Error>(event(&data(item))));
        Response::builder()
            .content_type("text/event-stream")
            .header("X-Accel-Buffering", "no")
            .header("Cache-Control", "no-cache")
            .body(Body::from_bytes_stream(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_data_lines_and_a_blank_line() {
        assert_eq!(
            &event(r#"{"type":"start"}"#)[..],
            b"data: {\"type\":\"start\"}\n\n"
        );
        assert_eq!(&event("[DONE]")[..], b"data: [DONE]\n\n");
        assert_eq!(&event("a\nb")[..], b"data: a\ndata: b\n\n");
    }

    #[tokio::test]
    async fn the_body_is_the_events_in_order() {
        let s = SseStream::new(
            futures::stream::iter(vec![Some(1), Some(2), None]).boxed(),
            |i: Option<i32>| i.map_or("[DONE]".into(), |i| i.to_string()),
        );
        let resp = s.into_response();
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        assert_eq!(resp.headers()["x-accel-buffering"], "no");
        let body = resp.into_body().into_bytes().await.unwrap();
        assert_eq!(&body[..], b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
    }
}
