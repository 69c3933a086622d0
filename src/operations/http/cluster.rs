//! The cluster name (`/api/cluster-name`) and the global parameters it is one of
//! (`/api/global-parameters`, RabbitMQ's `global_parameters` in definitions): FerryMQ has
//! `cluster_name` only; a name set here or by an import is kept across restarts and
//! takes the place of `http.cluster_name`. And a cluster's members
//! (`/api/ferrymq/cluster`): their state, a member added or forgotten.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value as Json_};

use super::access::commit;
use super::error::ApiError;
use super::json::Body;
use super::permit::{Administrator, Management, Monitoring, Permitted};
use super::HttpContext;
use crate::cluster::MembershipChange;

/// The one global parameter FerryMQ keeps.
pub const CLUSTER_NAME: &str = "cluster_name";

/// Why a global parameter of a definitions file or a call is not applied; `None` for
/// the ones FerryMQ applies.
pub fn unsupported(name: &str) -> Option<String> {
    match name {
        CLUSTER_NAME => None,
        "internal_cluster_id" => Some("FerryMQ is one node and keeps no cluster id (RabbitMQ makes its own)".into()),
        other => Some(format!("global parameter '{other}' is not supported")),
    }
}

/// Sets and stores the cluster name.
pub async fn set_cluster_name(ctx: &HttpContext, value: &Json_) -> Result<(), ApiError> {
    let name = value
        .as_str()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("the cluster name is a non-empty string"))?;
    let stored = serde_json::to_string(name).map_err(|e| ApiError::internal(e.to_string()))?;
    commit(ctx, ctx.broker.stores().access.put_global_parameter(CLUSTER_NAME, &stored)).await?;
    if !super::access::applied_by_commit(ctx) {
        ctx.access.set_cluster_name(name);
    }
    Ok(())
}

/// The global parameters as RabbitMQ lists them (and exports them).
pub fn global_parameters(ctx: &HttpContext) -> Vec<Json_> {
    vec![json!({ "name": CLUSTER_NAME, "value": ctx.access.cluster_name() })]
}

/// `GET /api/cluster-name`.
pub async fn cluster_name(p: Permitted<Management>) -> Result<Json<Json_>, ApiError> {
    Ok(Json(json!({ "name": p.ctx().access.cluster_name() })))
}

/// `PUT /api/cluster-name` with `{"name": ...}`.
pub async fn put_cluster_name(p: Permitted<Administrator>, Body(body): Body<Json_>) -> Result<StatusCode, ApiError> {
    set_cluster_name(p.ctx(), body.get("name").unwrap_or(&Json_::Null)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/global-parameters`.
pub async fn list(p: Permitted<Administrator>) -> Result<Json<Json_>, ApiError> {
    Ok(Json(Json_::Array(global_parameters(p.ctx()))))
}

/// `GET /api/global-parameters/{name}`.
pub async fn get(p: Permitted<Administrator>, Path(name): Path<String>) -> Result<Json<Json_>, ApiError> {
    global_parameters(p.ctx()).into_iter().find(|g| g["name"] == name).map(Json).ok_or_else(ApiError::not_found)
}

/// `PUT /api/global-parameters/{name}` with `{"value": ...}`: `cluster_name` only.
pub async fn put(
    p: Permitted<Administrator>,
    Path(name): Path<String>,
    Body(body): Body<Json_>,
) -> Result<StatusCode, ApiError> {
    if let Some(why) = unsupported(&name) {
        return Err(ApiError::bad_request(why));
    }
    set_cluster_name(p.ctx(), body.get("value").unwrap_or(&Json_::Null)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/ferrymq/cluster`: the metadata group as this member sees it (members, roles,
/// leader, term, last contact, how far each member's log matches the leader's); 404 on a
/// single node.
pub async fn status(p: Permitted<Monitoring>) -> Result<Json<Json_>, ApiError> {
    let cluster = p.ctx().cluster.as_ref().ok_or_else(ApiError::not_found)?;
    Ok(Json(serde_json::to_value(cluster.status()).unwrap_or_default()))
}

/// The body of `POST /api/ferrymq/cluster/members`.
#[derive(Debug, serde::Deserialize)]
pub struct NewMember {
    name: String,
    address: String,
}

/// `POST /api/ferrymq/cluster/members` with `{"name", "address"}`: the leader adds the
/// member (sent the whole log, then a voter). A member started with `cluster.peers` naming
/// the group asks for this by itself.
pub async fn add_member(p: Permitted<Administrator>, Body(body): Body<NewMember>) -> Result<StatusCode, ApiError> {
    let cluster = p.ctx().cluster.as_ref().ok_or_else(ApiError::not_found)?;
    crate::composition::config::PeerEntry::parse(&format!("{}@{}", body.name, body.address))
        .map_err(ApiError::bad_request)?;
    cluster.add_member(&body.name, &body.address).await.map_err(ApiError::internal)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /api/ferrymq/cluster/members/{name}`: the member is no longer one (it was lost,
/// or leaves for good); a majority is then counted without it.
pub async fn forget_member(p: Permitted<Administrator>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let cluster = p.ctx().cluster.as_ref().ok_or_else(ApiError::not_found)?;
    if !cluster.status().members.iter().any(|m| m.name == name) {
        return Err(ApiError::not_found());
    }
    cluster.change_members(MembershipChange::Forget { name }).await.map_err(ApiError::internal)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/ferrymq/cluster/data-groups/probe`: commits a probe through the data group
/// (through its leader, wherever it is) and says where and how long it took: whether the
/// group takes writes now. 503 when it does not within `cluster.command_timeout_ms`.
pub async fn probe_data_group(p: Permitted<Administrator>) -> Result<Json<Json_>, ApiError> {
    let cluster = p.ctx().cluster.as_ref().ok_or_else(ApiError::not_found)?;
    let started = std::time::Instant::now();
    let index = cluster.probe_data_group().await.map_err(ApiError::unavailable)?;
    Ok(Json(json!({ "index": index, "ms": started.elapsed().as_millis() as u64 })))
}
