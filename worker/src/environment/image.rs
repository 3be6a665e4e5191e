//! The image an environment starts from, checked on the worker: a name
//! the operator allows (`KILN_ENVIRONMENT_IMAGES`), which the API checked
//! already for environments it stored, but not for a repository's
//! `.kiln/environment.toml` nor for rows stored before the rule.
//!
//! The engine is given the canonical name (always with a tag or a digest,
//! so it can never be read as an image-id prefix), and the image it finds
//! must carry that name among its own `RepoTags`/`RepoDigests`. The
//! engine's errors go to the log only: told apart ("no such image",
//! "ambiguous"), they would let a tenant walk the engine's image ids.

use bollard::Docker;
use kiln_protocol::image_name::{ImageName, ImagePatterns};

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
pub async fn allowed(docker: &Docker, patterns: &ImagePatterns, raw: &str) -> Result<Usable, String> {
    let name = patterns.check(raw).map_err(|refusal| {
        tracing::warn!(image = %raw, %refusal, "an environment names an image this deployment does not allow");
        not_available(raw)
    })?;
    let canonical = name.to_string();
    let inspected = inspect(docker, &canonical).await.ok_or_else(|| not_available(raw))?;
    let names = inspected.repo_tags.iter().flatten().chain(inspected.repo_digests.iter().flatten());
    let carries = names.filter_map(|n| ImageName::parse(n).ok()).any(|n| n == name);
    if !carries {
        tracing::warn!(image = %canonical, "the engine's image does not carry the allowed name; refused");
        return Err(not_available(raw));
    }
    let id = inspected.id.unwrap_or_default();
    Ok(Usable { name: canonical, id })
}

/// The deployment's sandbox image (the operator's, not checked against
/// the patterns); `Err`: the run's failure message.
pub async fn deployment(docker: &Docker, image: &str) -> Result<Usable, String> {
    let inspected = inspect(docker, image).await.ok_or_else(|| not_available(image))?;
    Ok(Usable { name: image.to_owned(), id: inspected.id.unwrap_or_default() })
}

/// The engine's view of `name`; its error, if any, is logged, not returned.
async fn inspect(docker: &Docker, name: &str) -> Option<bollard::models::ImageInspect> {
    match docker.inspect_image(name).await {
        Ok(image) => Some(image),
        Err(e) => {
            tracing::warn!(image = %name, error = %e, "inspecting an environment's image failed");
            None
        }
    }
}
