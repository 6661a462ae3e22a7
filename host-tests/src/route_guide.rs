//! routeguide.RouteGuide, the classic example service with one method of
//! each streaming kind, over a JSON database of features.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::pb::routeguide::route_guide_server::{self, RouteGuideServer};
use crate::pb::routeguide::{Feature, Point, Rectangle, RouteNote, RouteSummary};
use crate::BoxError;

/// Mean earth radius of the haversine formula, in metres.
const EARTH_RADIUS_M: f64 = 6_371_000.0;
/// Points carry degrees multiplied by this.
const COORD_FACTOR: f64 = 1e7;

/// The database shipped with the crate, found through the source tree so the
/// binary works from any working directory.
pub fn default_db_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/route_guide_db.json")
}

#[derive(Deserialize)]
struct DbFeature {
    location: DbPoint,
    name: String,
}

#[derive(Deserialize)]
struct DbPoint {
    latitude: i32,
    longitude: i32,
}

/// Reads a JSON array of `{"location":{"latitude":..,"longitude":..},"name":..}`.
pub fn load_db(path: &Path) -> Result<Vec<Feature>, BoxError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let rows: Vec<DbFeature> =
        serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    Ok(rows.into_iter().map(DbFeature::into_feature).collect())
}

impl DbFeature {
    fn into_feature(self) -> Feature {
        Feature {
            name: self.name,
            location: Some(Point {
                latitude: self.location.latitude,
                longitude: self.location.longitude,
            }),
        }
    }
}

/// Whether `p` lies inside the rectangle, edges included. The corners may be
/// given in any order, as the proto only says they are opposite.
pub fn in_rectangle(rect: &Rectangle, p: &Point) -> bool {
    let lo = rect.lo.unwrap_or_default();
    let hi = rect.hi.unwrap_or_default();
    let (lat_min, lat_max) = (lo.latitude.min(hi.latitude), lo.latitude.max(hi.latitude));
    let (lon_min, lon_max) = (
        lo.longitude.min(hi.longitude),
        lo.longitude.max(hi.longitude),
    );
    (lat_min..=lat_max).contains(&p.latitude) && (lon_min..=lon_max).contains(&p.longitude)
}

/// Great-circle distance in metres (haversine formula).
pub fn distance_m(a: &Point, b: &Point) -> f64 {
    let lat1 = (f64::from(a.latitude) / COORD_FACTOR).to_radians();
    let lat2 = (f64::from(b.latitude) / COORD_FACTOR).to_radians();
    let dlat = lat2 - lat1;
    let dlon = (f64::from(b.longitude - a.longitude) / COORD_FACTOR).to_radians();
    let h = (dlat / 2.0).sin().powi(2) + lat1.cos() * lat2.cos() * (dlon / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_M * h.sqrt().asin()
}

/// Running totals of a RecordRoute call, kept apart from the stream so they
/// can be tested without a server.
#[derive(Debug, Default)]
pub struct RouteTally {
    points: i32,
    features: i32,
    distance_m: f64,
    last: Option<Point>,
}

impl RouteTally {
    pub fn add(&mut self, point: Point, db: &[Feature]) {
        self.points = self.points.saturating_add(1);
        if named_feature_at(db, &point).is_some() {
            self.features = self.features.saturating_add(1);
        }
        if let Some(last) = &self.last {
            self.distance_m += distance_m(last, &point);
        }
        self.last = Some(point);
    }

    /// The distance is summed in f64 and rounded once, so many short legs do
    /// not each lose up to a metre.
    pub fn finish(&self, elapsed: Duration) -> RouteSummary {
        RouteSummary {
            point_count: self.points,
            feature_count: self.features,
            distance: self.distance_m.round() as i32,
            elapsed_time: i32::try_from(elapsed.as_secs()).unwrap_or(i32::MAX),
        }
    }
}

fn feature_at<'a>(db: &'a [Feature], point: &Point) -> Option<&'a Feature> {
    db.iter().find(|f| f.location.as_ref() == Some(point))
}

fn named_feature_at<'a>(db: &'a [Feature], point: &Point) -> Option<&'a Feature> {
    feature_at(db, point).filter(|f| !f.name.is_empty())
}

#[derive(Debug, Clone)]
pub struct RouteGuide {
    features: Arc<Vec<Feature>>,
}

impl RouteGuide {
    pub fn new(features: Vec<Feature>) -> Self {
        RouteGuide {
            features: Arc::new(features),
        }
    }
}

/// The service over `features`, ready for `Server::add_service`.
pub fn service(features: Vec<Feature>) -> RouteGuideServer<RouteGuide> {
    RouteGuideServer::new(RouteGuide::new(features))
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl route_guide_server::RouteGuide for RouteGuide {
    async fn get_feature(&self, request: Request<Point>) -> Result<Response<Feature>, Status> {
        let point = request.into_inner();
        let feature = feature_at(&self.features, &point)
            .cloned()
            .unwrap_or(Feature {
                name: String::new(),
                location: Some(point),
            });
        Ok(Response::new(feature))
    }

    type ListFeaturesStream = BoxStream<Feature>;

    async fn list_features(
        &self,
        request: Request<Rectangle>,
    ) -> Result<Response<Self::ListFeaturesStream>, Status> {
        let rect = request.into_inner();
        let inside: Vec<Result<Feature, Status>> = self
            .features
            .iter()
            .filter(|f| !f.name.is_empty())
            .filter(|f| f.location.as_ref().is_some_and(|p| in_rectangle(&rect, p)))
            .cloned()
            .map(Ok)
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(inside))))
    }

    async fn record_route(
        &self,
        request: Request<Streaming<Point>>,
    ) -> Result<Response<RouteSummary>, Status> {
        let started = Instant::now();
        let mut points = request.into_inner();
        let mut tally = RouteTally::default();
        while let Some(point) = points.message().await? {
            tally.add(point, &self.features);
        }
        Ok(Response::new(tally.finish(started.elapsed())))
    }

    type RouteChatStream = BoxStream<RouteNote>;

    /// Notes are kept per call, not server-wide, so that repeated test runs
    /// against one server see the same answers.
    async fn route_chat(
        &self,
        request: Request<Streaming<RouteNote>>,
    ) -> Result<Response<Self::RouteChatStream>, Status> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(32);
        tokio::spawn(chat(inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Drives one RouteChat call; returns when the client is done or gone.
async fn chat(mut inbound: Streaming<RouteNote>, tx: mpsc::Sender<Result<RouteNote, Status>>) {
    let mut notes: HashMap<(i32, i32), Vec<RouteNote>> = HashMap::new();
    loop {
        let note = match inbound.message().await {
            Ok(Some(note)) => note,
            Ok(None) => return,
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        };
        let at = note.location.unwrap_or_default();
        let earlier = notes.entry((at.latitude, at.longitude)).or_default();
        for previous in earlier.iter() {
            if tx.send(Ok(previous.clone())).await.is_err() {
                return;
            }
        }
        earlier.push(note);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(latitude: i32, longitude: i32) -> Point {
        Point {
            latitude,
            longitude,
        }
    }

    #[test]
    fn one_degree_of_latitude() {
        // One degree of arc on a 6371 km sphere: 6371000 * pi / 180.
        let d = distance_m(
            &pt(400_000_000, -740_000_000),
            &pt(410_000_000, -740_000_000),
        );
        assert!((d - 111_194.926_644_558_7).abs() < 1e-6, "{d}");
    }

    #[test]
    fn diagonal_distance() {
        // Value from an independent haversine computation of the same points.
        let d = distance_m(
            &pt(404_000_000, -744_000_000),
            &pt(405_000_000, -745_000_000),
        );
        assert!((d - 13_972.909_089_7).abs() < 1e-3, "{d}");
    }

    #[test]
    fn zero_distance() {
        assert_eq!(distance_m(&pt(1, 2), &pt(1, 2)), 0.0);
    }

    #[test]
    fn rectangle_with_corners_in_any_order() {
        let rect = Rectangle {
            lo: Some(pt(410, -740)),
            hi: Some(pt(400, -750)),
        };
        assert!(in_rectangle(&rect, &pt(405, -745)));
        assert!(in_rectangle(&rect, &pt(400, -750)), "edges are inside");
        assert!(in_rectangle(&rect, &pt(410, -740)), "edges are inside");
        assert!(!in_rectangle(&rect, &pt(411, -745)));
        assert!(!in_rectangle(&rect, &pt(405, -739)));
    }

    #[test]
    fn tally_counts_named_features_only() {
        let db = vec![
            Feature {
                name: "A".into(),
                location: Some(pt(400_000_000, -740_000_000)),
            },
            Feature {
                name: String::new(),
                location: Some(pt(410_000_000, -740_000_000)),
            },
        ];
        let mut tally = RouteTally::default();
        tally.add(pt(400_000_000, -740_000_000), &db);
        tally.add(pt(410_000_000, -740_000_000), &db);
        tally.add(pt(410_000_000, -740_000_000), &db);
        let summary = tally.finish(Duration::from_millis(2500));
        assert_eq!(summary.point_count, 3);
        assert_eq!(summary.feature_count, 1);
        assert_eq!(summary.distance, 111_195);
        assert_eq!(summary.elapsed_time, 2);
    }

    #[test]
    fn shipped_db_loads() {
        let db = load_db(&default_db_path()).expect("shipped db");
        assert!(db.len() >= 30, "{}", db.len());
        assert!(db.iter().any(|f| f.name.is_empty()));
    }
}
