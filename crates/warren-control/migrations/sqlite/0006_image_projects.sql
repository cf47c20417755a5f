-- Images belong to projects: built into one, readable by its subtree, usable by sandboxes of
-- that project and those below it. Images from before projects are root's (shared by all).
ALTER TABLE images ADD COLUMN project TEXT NOT NULL DEFAULT 'root';
CREATE INDEX images_project ON images (project);
