"""Static files of the web console (``console.html``, ``console.js``, ``console.css``), served by
``actors/http/console.py`` — plain files, no build step."""
