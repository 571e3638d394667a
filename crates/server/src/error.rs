//! Errors in the OpenAI shape (`{"error": {"message", "type", "param", "code"}}`) with their HTTP status.

use std::borrow::Cow;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    kind: &'static str,
    /// The request field at fault: a name of ours, or one the client sent.
    param: Option<Cow<'static, str>>,
    code: Option<&'static str>,
    retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong API key (send Authorization: Bearer KEY)",
        )
        .code("invalid_api_key")
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds {limit} bytes"),
        )
    }

    pub fn busy(queue: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("all slots are busy and {queue} requests are waiting; retry shortly"),
        );
        e.retry_after = Some(1);
        e
    }

    /// A request body that did not arrive whole in time.
    pub fn body_timeout(after: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!("the request body did not arrive whole within {} s", after.as_secs_f64()),
        )
    }

    /// The server cannot take the request now (too many connections); retrying shortly may succeed.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.retry_after = Some(1);
        e
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn param(mut self, p: impl Into<Cow<'static, str>>) -> ApiError {
        self.param = Some(p.into());
        self
    }

    pub fn code(mut self, c: &'static str) -> ApiError {
        self.code = Some(c);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
