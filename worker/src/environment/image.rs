//! The image an environment starts from, checked on the worker: a name
//! the operator allows (`KILN_ENVIRONMENT_IMAGES`), which the API checked
//! already for environments it stored, but not for a repository's
//! `.kiln/environment.toml` nor for rows stored before the rule.
//!
//! The backend's image store (`sandbox::ImageStore`) is given the canonical name (always with a tag or a digest,
//! so it can never be read as an image-id prefix), and the image it finds
//! must carry that name among its own `RepoTags`/`RepoDigests`. The
//! engine's errors go to the log only: told apart ("no such image",
//! "ambiguous"), they would let a tenant walk the engine's image ids.

use kiln_protocol::image_name::{ImageName, ImagePatterns};

use crate::sandbox::ImageStore;
use crate::sandbox::image_store::ImageInfo;

/// What a run that cannot have the image fails with, whatever the reason.
pub fn not_available(raw: &str) -> String {
    format!("the image {raw:?} is not available to this deployment")
}

/// A checked image: the name the engine is given, and its id there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usable {
    pub name: String,
    pub id: String,
}

/// The environment's own image (`raw`), if this deployment allows it and
/// the engine has it under that name; `Err`: the run's failure message.
pub async fn allowed(images: &dyn ImageStore, patterns: &ImagePatterns, raw: &str) -> Result<Usable, String> {
    let name = patterns.check(raw).map_err(|refusal| {
        tracing::warn!(image = %raw, %refusal, "an environment names an image this deployment does not allow");
        not_available(raw)
    })?;
    let canonical = name.to_string();
    let inspected = inspect(images, &canonical).await.ok_or_else(|| not_available(raw))?;
    let carries = inspected.names.iter().filter_map(|n| ImageName::parse(n).ok()).any(|n| n == name);
    if !carries {
        tracing::warn!(image = %canonical, "the engine's image does not carry the allowed name; refused");
        return Err(not_available(raw));
    }
    Ok(Usable { name: canonical, id: inspected.id })
}

/// The deployment's sandbox image (the operator's, not checked against
/// the patterns); `Err`: the run's failure message.
pub async fn deployment(images: &dyn ImageStore, image: &str) -> Result<Usable, String> {
    let inspected = inspect(images, image).await.ok_or_else(|| not_available(image))?;
    Ok(Usable { name: image.to_owned(), id: inspected.id })
}

/// The store's view of `name`; its error, if any, is logged, not returned.
async fn inspect(images: &dyn ImageStore, name: &str) -> Option<ImageInfo> {
    match images.image(name).await {
        Ok(Some(image)) => Some(image),
        Ok(None) => {
            tracing::warn!(image = %name, "an environment's image is not in the image store");
            None
        }
        Err(e) => {
            tracing::warn!(image = %name, error = %e, "inspecting an environment's image failed");
            None
        }
    }
}
