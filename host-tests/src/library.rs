//! example.library.v1.Library, the transcoding fixture: an in-memory store
//! of shelves and books, enough to check every kind of HTTP binding.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Mutex;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::pb::example::library::v1::library_server::{self, LibraryServer};
use crate::pb::example::library::v1::{
    Book, CreateBookRequest, GetBookRequest, GetShelfRequest, ListBooksRequest, ListBooksResponse,
    MoveBookRequest, SearchBooksRequest, Shelf, UpdateBookRequest,
};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[derive(Debug, Default)]
pub struct Library {
    books: Mutex<BTreeMap<String, Book>>,
}

pub fn service() -> LibraryServer<Library> {
    LibraryServer::new(Library::default())
}

impl Library {
    fn books(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Book>> {
        // A poisoned lock only means another call panicked; the map is still usable.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn on_shelf(&self, shelf: i64) -> Vec<Book> {
        let prefix = format!("shelves/{shelf}/books/");
        self.books()
            .values()
            .filter(|b| b.name.starts_with(&prefix))
            .cloned()
            .collect()
    }
}

fn shelf(id: i64) -> Result<Shelf, Status> {
    if id <= 0 {
        return Err(Status::not_found(format!("no shelf {id}")));
    }
    Ok(Shelf {
        id,
        theme: format!("theme-{id}"),
    })
}

#[tonic::async_trait]
impl library_server::Library for Library {
    async fn get_shelf(&self, r: Request<GetShelfRequest>) -> Result<Response<Shelf>, Status> {
        shelf(r.into_inner().shelf).map(Response::new)
    }

    async fn create_shelf(&self, r: Request<Shelf>) -> Result<Response<Shelf>, Status> {
        Ok(Response::new(r.into_inner()))
    }

    async fn get_book(&self, r: Request<GetBookRequest>) -> Result<Response<Book>, Status> {
        let name = r.into_inner().name;
        self.books()
            .get(&name)
            .cloned()
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("no book {name}")))
    }

    async fn create_book(&self, r: Request<CreateBookRequest>) -> Result<Response<Book>, Status> {
        let req = r.into_inner();
        let mut book = req.book.unwrap_or_default();
        let n = self.on_shelf(req.shelf).len() + 1;
        book.name = format!("shelves/{}/books/{n}", req.shelf);
        self.books().insert(book.name.clone(), book.clone());
        Ok(Response::new(book))
    }

    async fn update_book(&self, r: Request<UpdateBookRequest>) -> Result<Response<Book>, Status> {
        let req = r.into_inner();
        let update = req.book.unwrap_or_default();
        let paths = req.update_mask.map(|m| m.paths).unwrap_or_default();
        let mut books = self.books();
        let book = books
            .get_mut(&update.name)
            .ok_or_else(|| Status::not_found(format!("no book {}", update.name)))?;
        for path in &paths {
            match path.as_str() {
                "title" => book.title = update.title.clone(),
                "author" => book.author = update.author.clone(),
                other => return Err(Status::invalid_argument(format!("cannot update {other}"))),
            }
        }
        Ok(Response::new(book.clone()))
    }

    async fn delete_book(&self, r: Request<GetBookRequest>) -> Result<Response<()>, Status> {
        let name = r.into_inner().name;
        self.books()
            .remove(&name)
            .map(|_| Response::new(()))
            .ok_or_else(|| Status::not_found(format!("no book {name}")))
    }

    async fn list_books(
        &self,
        r: Request<ListBooksRequest>,
    ) -> Result<Response<ListBooksResponse>, Status> {
        let req = r.into_inner();
        let mut books = self.on_shelf(req.shelf);
        books.retain(|b| req.author.is_empty() || b.author == req.author);
        if let Some(page) = req.page.filter(|p| p.size > 0) {
            books.truncate(page.size as usize);
        }
        Ok(Response::new(ListBooksResponse {
            books,
            next_page_token: String::new(),
        }))
    }

    async fn move_book(&self, r: Request<MoveBookRequest>) -> Result<Response<Book>, Status> {
        let req = r.into_inner();
        let mut books = self.books();
        let mut book = books
            .remove(&req.name)
            .ok_or_else(|| Status::not_found(format!("no book {}", req.name)))?;
        book.name = format!(
            "shelves/{}/books/moved-{}",
            req.other_shelf,
            books.len() + 1
        );
        books.insert(book.name.clone(), book.clone());
        Ok(Response::new(book))
    }

    async fn search_books(
        &self,
        r: Request<SearchBooksRequest>,
    ) -> Result<Response<ListBooksResponse>, Status> {
        let query = r.into_inner().query;
        let books = self
            .books()
            .values()
            .filter(|b| b.title.contains(&query))
            .cloned()
            .collect();
        Ok(Response::new(ListBooksResponse {
            books,
            next_page_token: String::new(),
        }))
    }

    async fn head_shelf(&self, r: Request<GetShelfRequest>) -> Result<Response<Shelf>, Status> {
        shelf(r.into_inner().shelf).map(Response::new)
    }

    type StreamBooksStream = BoxStream<Book>;

    async fn stream_books(
        &self,
        r: Request<ListBooksRequest>,
    ) -> Result<Response<Self::StreamBooksStream>, Status> {
        let books: Vec<Result<Book, Status>> = self
            .on_shelf(r.into_inner().shelf)
            .into_iter()
            .map(Ok)
            .collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(books))))
    }
}
