//! Field selectors on custom resources (a CRD's `selectableFields`) are
//! served from Kubernetes 1.31 (`CustomResourceFieldSelectors`, beta and on
//! by default; alpha and off in 1.30). An older API server answers a list
//! or watch that uses one with 400 "field label not supported": callers
//! then list everything and filter themselves.

use kube::{Api, Resource, api::ListParams};
use serde::de::DeserializeOwned;

/// Whether `error` is the API server refusing a field selector it cannot
/// serve (400, "field label not supported: ...").
pub fn unsupported_field_selector(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.code == 400 && status.message.contains("field label not supported"))
}

/// Whether the API server serves `selector` on `api`'s kind: one list of
/// at most one object. Any other answer (an error of another kind
/// included) counts as served, so a passing fault does not turn a cheap
/// watch into a watch of everything; a watch that then fails says so in
/// its own retries.
pub async fn serves_field_selector<K>(api: &Api<K>, selector: &str) -> bool
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api
        .list(&ListParams::default().fields(selector).limit(1))
        .await
    {
        Err(error) if unsupported_field_selector(&error) => {
            tracing::warn!(
                kind = %K::kind(&()),
                selector,
                "the API server serves no field selectors on this kind (Kubernetes before 1.31): listing every object and filtering here"
            );
            false
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "BadRequest")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn only_the_refused_field_label_is_taken_for_no_support() {
        assert!(unsupported_field_selector(&api_error(
            400,
            "field label not supported: spec.nodeName"
        )));
        assert!(!unsupported_field_selector(&api_error(400, "bad request")));
        assert!(!unsupported_field_selector(&api_error(
            403,
            "field label not supported"
        )));
    }
}
