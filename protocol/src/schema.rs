//! OpenAPI schemas that a derive cannot express.
//!
//! [`StoredEvent`] keeps its payload as raw JSON so an API instance can serve
//! kinds newer than itself, but what it serves is always an [`EventBody`]
//! (`kind` and `payload`) plus `seq` and `at`: its schema says so, so that
//! clients generated from the spec get typed payloads.

use utoipa::openapi::schema::{AllOfBuilder, KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::event::{EventBody, StoredEvent};

impl PartialSchema for StoredEvent {
    fn schema() -> RefOr<Schema> {
        let seq = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .description(Some("Position in the run's stream, dense from 1; the SSE `id`, and what `Last-Event-ID` and `after` resume from."));
        let at = ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .description(Some("When the event was recorded."));
        let envelope = ObjectBuilder::new().property("seq", seq).required("seq").property("at", at).required("at");
        AllOfBuilder::new()
            .item(envelope)
            .item(Ref::from_schema_name(EventBody::name()))
            .description(Some("One event of a run: its place in the stream and its `kind` and `payload`."))
            .into()
    }
}

impl ToSchema for StoredEvent {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((EventBody::name().into_owned(), EventBody::schema()));
        EventBody::schemas(schemas);
    }
}
