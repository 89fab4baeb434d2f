-- make installcheck runs this first on the server it is pointed at.
-- With outbox in shared_preload_libraries, a background worker serves every
-- database that has the extension unless outbox.databases names others; its
-- sweep and purge would race the regression and isolation tests, which call
-- them and show their results.  Refuse such a server with the reason.
\set ON_ERROR_STOP 1
SET outbox_installcheck.dbs = :'dbs';
DO $$
DECLARE
	served text := coalesce(current_setting('outbox.databases', true), '');
	db text;
BEGIN
	IF current_setting('shared_preload_libraries') !~ '(^|[\s,"])outbox([\s,"]|$)' THEN
		RETURN;
	END IF;
	FOREACH db IN ARRAY string_to_array(current_setting('outbox_installcheck.dbs'), ' ') LOOP
		IF served !~ '\S' OR served ~ ('(^|[\s,"])' || db || '([\s,"]|$)') THEN
			RAISE EXCEPTION 'outbox is preloaded and its background worker would serve the test database %', db
				USING ERRCODE = '55000',
					  HINT = 'Set outbox.databases to a list without the test databases (for example ''postgres''), reload the server and run make installcheck again, or use a server without outbox in shared_preload_libraries.';
		END IF;
	END LOOP;
END
$$;
