-- A project's limit on function calls in flight at once (over it and its subtree).
ALTER TABLE projects ADD COLUMN max_fncalls BIGINT;
