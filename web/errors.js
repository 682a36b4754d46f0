// An error a caller can act on. Its `name` is the cera.errors type (InvalidArgument, BadFile,
// TooLarge, ...) or a download error of models.js (FetchFailed); "Error" alone is a bug.
export class CeraError extends Error {
  constructor(name, message) { super(message); this.name = name; }
}
