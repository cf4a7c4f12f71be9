//! The object store of uploaded files (avatars), on `object_store`.
//!
//! `STORAGE_URL` picks the store:
//! * `file:///abs/dir` (default `file://<DATA_DIR>/storage`): the local
//!   filesystem; an object `avatars/<user>/avatar` is the file
//!   `<dir>/avatars/<user>/avatar`. Writes go to a staging file renamed into
//!   place when complete, so a reader never sees half an object.
//! * `s3://bucket[/prefix]`: any S3-compatible store, configured by the usual
//!   `AWS_*` variables as `object_store` reads them (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL` for a non-AWS
//!   endpoint, `AWS_ALLOW_HTTP=true` for a plain-http one,
//!   `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`). Requests time out after 30 s and are
//!   retried with backoff for up to 30 s.
//!
//! Used by the api (signed uploads, serving) and by the worker (avatar cleanup).

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use object_store::{
    aws::{AmazonS3Builder, AmazonS3ConfigKey},
    local::LocalFileSystem,
    path::Path,
    prefix::PrefixStore,
    Attribute, Attributes, ClientConfigKey, GetOptions, GetResult, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, RetryConfig, WriteMultipart,
};

/// Part size for the local filesystem: each part is written to the staging
/// file as it arrives, so an upload holds about this much in memory.
const FS_PART: usize = 64 * 1024;
/// S3's smallest part but the last (5 MiB): an avatar (≤ 2 MiB) is one part.
const S3_PART: usize = 5 * 1024 * 1024;
/// Parts in flight per upload: one, so an upload holds at most two parts and
/// keeps at most one blocking write (local filesystem) busy; the request body
/// arrives no faster than a part is written anyway.
const PARTS_IN_FLIGHT: usize = 1;

/// Why a bounded upload did not complete. Nothing is written in any case.
///
/// `E` is the error type of the caller's body stream, handed back unchanged.
#[derive(Debug, thiserror::Error)]
pub enum UploadError<E> {
    /// More bytes arrived than allowed.
    #[error("the body exceeds {max} bytes")]
    TooLarge {
        /// The limit, in bytes.
        max: u64,
    },
    /// Reading the request body failed: the body stream's own error.
    #[error("reading the body failed")]
    Body(E),
    /// The store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
}

/// An upload whose bytes have all been written to the store but that is not
/// in place yet: [`Staged::complete`] puts it in place (on the local
/// filesystem a rename, on S3 `CompleteMultipartUpload`), [`Staged::abort`]
/// discards it. Until then readers see the previous object.
pub struct Staged {
    writer: WriteMultipart,
    key: String,
    size: u64,
}

impl fmt::Debug for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staged")
            .field("key", &self.key)
            .field("size", &self.size)
            .finish()
    }
}

impl Staged {
    /// The number of bytes staged.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Puts the object in place, replacing any previous one; returns its size.
    pub async fn complete(self) -> Result<u64, object_store::Error> {
        self.writer.finish().await?;
        Ok(self.size)
    }

    /// Discards the staged bytes (best effort: a failure is logged).
    pub async fn abort(self) {
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(key = self.key, error = %e, "aborting a staged upload failed");
        }
    }
}

/// A handle on the configured object store (cheap to clone).
#[derive(Clone)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
    part_size: usize,
    /// The local filesystem store keeps no attributes (content type).
    keeps_attributes: bool,
    url: String,
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage").field("url", &self.url).finish()
    }
}

impl Storage {
    /// Opens the store of `STORAGE_URL` (`file://…` or `s3://bucket[/prefix]`);
    /// creates the local directory when missing. Errors name the problem
    /// (bad URL, missing S3 settings).
    pub fn open(storage_url: &str) -> anyhow::Result<Self> {
        let url = url::Url::parse(storage_url)
            .map_err(|e| anyhow::anyhow!("STORAGE_URL {storage_url:?}: {e}"))?;
        match url.scheme() {
            "file" => {
                let dir = url.to_file_path().map_err(|_| {
                    anyhow::anyhow!("STORAGE_URL {storage_url:?}: not a local path")
                })?;
                std::fs::create_dir_all(&dir).map_err(|e| {
                    anyhow::anyhow!("STORAGE_URL: cannot create {}: {e}", dir.display())
                })?;
                let store = LocalFileSystem::new_with_prefix(&dir)?.with_automatic_cleanup(true);
                Ok(Storage {
                    store: Arc::new(store),
                    part_size: FS_PART,
                    keeps_attributes: false,
                    url: storage_url.to_string(),
                })
            }
            "s3" => {
                let bucket = url.host_str().unwrap_or_default();
                if bucket.is_empty() {
                    anyhow::bail!("STORAGE_URL {storage_url:?}: s3://<bucket>[/prefix] expected");
                }
                // Timeouts through `with_config`, so the client settings read
                // from the environment (AWS_ALLOW_HTTP, proxies) stay in force.
                let s3 = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), "30s")
                    .with_config(
                        AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        "5s",
                    )
                    .with_retry(RetryConfig {
                        max_retries: 5,
                        retry_timeout: Duration::from_secs(30),
                        ..Default::default()
                    })
                    .build()
                    .map_err(|e| anyhow::anyhow!("STORAGE_URL {storage_url:?}: {e}"))?;
                let prefix = url.path().trim_matches('/');
                let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
                    Arc::new(s3)
                } else {
                    Arc::new(PrefixStore::new(s3, prefix))
                };
                Ok(Storage {
                    store,
                    part_size: S3_PART,
                    keeps_attributes: true,
                    url: storage_url.to_string(),
                })
            }
            other => anyhow::bail!("STORAGE_URL: unsupported scheme {other:?} (file or s3)"),
        }
    }

    /// Stages the byte stream `body` for `key`: writes it to the store
    /// without putting it in place ([`Staged::complete`] does that, once the
    /// caller has finished its own bookkeeping). On any failure the staged
    /// bytes are discarded and the previous object stays.
    ///
    /// At most `max` bytes are accepted: one more and the upload is aborted
    /// with [`UploadError::TooLarge`]; a body error aborts with
    /// [`UploadError::Body`] carrying it unchanged.
    ///
    /// Memory: about one part (64 KiB on the local filesystem; on S3 the whole
    /// object, at most `max`, since S3 parts but the last are ≥ 5 MiB).
    pub async fn stage<S, E>(
        &self,
        key: &str,
        content_type: &str,
        body: S,
        max: u64,
    ) -> Result<Staged, UploadError<E>>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
    {
        let mut body = body;
        let mut opts = PutMultipartOptions::default();
        if self.keeps_attributes {
            let mut attributes = Attributes::new();
            attributes.insert(Attribute::ContentType, content_type.to_string().into());
            opts.attributes = attributes;
        }
        let location = Path::from(key);
        let upload = self.store.put_multipart_opts(&location, opts).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_size);
        let mut total: u64 = 0;
        let streamed: Result<(), UploadError<E>> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(UploadError::Body)?;
                total += chunk.len() as u64;
                if total > max {
                    return Err(UploadError::TooLarge { max });
                }
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                // `write` copies into the part buffer, so the request's read
                // buffers are released at once.
                writer.write(&chunk);
            }
            Ok(())
        }
        .await;
        let staged = Staged {
            writer,
            key: key.to_string(),
            size: total,
        };
        match streamed {
            Ok(()) => Ok(staged),
            Err(e) => {
                staged.abort().await;
                Err(e)
            }
        }
    }

    /// Opens `key` for reading; `None` when there is no such object.
    pub async fn get(&self, key: &str) -> Result<Option<GetResult>, object_store::Error> {
        match self
            .store
            .get_opts(&Path::from(key), GetOptions::default())
            .await
        {
            Ok(r) => Ok(Some(r)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes `key`; a missing object is not an error (deletes are idempotent).
    pub async fn delete(&self, key: &str) -> Result<(), object_store::Error> {
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
