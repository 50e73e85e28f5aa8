"""The Responses API (`/v1/responses`) on the request pipeline: translation to chat completions,
typed stream events and stored conversations (docs/responses.md)."""
